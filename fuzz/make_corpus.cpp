// Writes the seed corpus: small valid files made by the writer, plus a few invalid
// ones near the valid shape so that the fuzzer starts close to the interesting edges.
//   make_corpus <dir>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace {

void raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  std::ofstream(path, std::ios::binary) << len << header << std::string(data_bytes, '\x01');
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string d = std::string(argv[1]) + "/";
  using st::DType;
  std::vector<float> f = {1.0f, -2.5f, 0.0f, 3.0f};
  std::vector<uint16_t> h = {0x3c00, 0x7c00, 0x0001, 0x8000};
  std::vector<double> f64 = {1e300, -0.5};
  std::vector<int64_t> i64 = {-1, 7};
  st::write_safetensors(d + "valid_f32", {{"w", DType::F32, {2, 2}, f.data()}});
  st::write_safetensors(d + "valid_mixed",
                        {{"model.norm.weight", DType::BF16, {4}, h.data()},
                         {"h", DType::F16, {2, 2}, h.data()},
                         {"d", DType::F64, {2}, f64.data()},
                         {"i", DType::I64, {1, 2}, i64.data()}},
                        {{"format", "pt"}});
  st::write_safetensors(d + "valid_scalar_empty", {{"s", DType::F32, {}, f.data()},
                                                   {"z", DType::I32, {0, 5}, nullptr}});
  st::write_safetensors(d + "valid_none", {});
  raw(d + "bad_overlap",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  raw(d + "bad_dtype", R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", 4);
  raw(d + "bad_shape", R"({"a":{"dtype":"F32","shape":[-1,2.5],"data_offsets":[0,4]}})", 4);
  std::ofstream(d + "index.json") << R"({"metadata":{"total_size":8},)"
                                  << R"("weight_map":{"a":"model-00001-of-00002.safetensors",)"
                                  << R"("b":"model-00002-of-00002.safetensors"}})";
  return 0;
}
