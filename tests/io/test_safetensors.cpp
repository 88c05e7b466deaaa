#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/temp_dir.h"

namespace st {
namespace {

namespace fs = std::filesystem;

using testing::expect_error;
using testing::read_file;
using testing::write_file;

// A fresh directory per test, so that tests never see each other's files.
fs::path test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return testing::temp_dir(std::string("io_") + info->test_suite_name() + "_" + info->name());
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A file with the given header text and `data_bytes` zero bytes of data.
std::string st_file(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string bytes_at(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

TEST(Safetensors, RoundTripIsBitExact) {
  const fs::path path = test_dir() / "rt.safetensors";
  // Values chosen to catch any conversion on the way: NaN payloads, -0, inf, denormals.
  std::vector<uint32_t> f32 = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00001,
                               0x00000001, 0x3f800000, 0xdeadbeef};
  std::vector<uint16_t> bf16 = {0x0000, 0x8000, 0x7f80, 0x7fc1, 0x3f80, 0x0001};
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00, 0x7e01};
  float scalar = -3.25f;
  const std::vector<TensorToWrite> in = {
      {"w.f32", DType::F32, {2, 4}, f32.data()},
      {"w.bf16", DType::BF16, {3, 2}, bf16.data()},
      {"w.f16", DType::F16, {6}, f16.data()},
      {"scalar", DType::F32, {}, &scalar},
      {"empty", DType::F32, {0, 3}, nullptr},
      {"empty.bf16", DType::BF16, {2, 0}, nullptr},
  };
  write_safetensors(path.string(), in, {{"format", "pt"}});
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));

  const auto f = SafetensorsFile::open(path.string());
  ASSERT_EQ(f.tensors().size(), in.size());
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  for (size_t i = 0; i < in.size(); ++i) {
    // Offsets are contiguous in the given order, so tensors() (by offset) keeps it; the
    // two zero-size tensors at the end share an offset and tie-break by name.
    const TensorInfo* t = f.find(in[i].name);
    ASSERT_NE(t, nullptr) << in[i].name;
    EXPECT_EQ(t->dtype, in[i].dtype) << in[i].name;
    EXPECT_EQ(t->shape, in[i].shape) << in[i].name;
    EXPECT_EQ(t->numel() * dtype_size(t->dtype), t->nbytes());
    if (t->nbytes())
      EXPECT_EQ(bytes_at(f.data(*t), t->nbytes()), bytes_at(in[i].data, t->nbytes())) << in[i].name;
  }
  for (size_t i = 0; i + 2 < in.size(); ++i) EXPECT_EQ(f.tensors()[i].name, in[i].name);
  EXPECT_EQ(f.find("scalar")->numel(), 1u);
  EXPECT_EQ(f.find("empty")->numel(), 0u);
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(f.read_f32("scalar"), std::vector<float>{-3.25f});
  EXPECT_TRUE(f.read_f32("empty").empty());
}

TEST(Safetensors, HeaderIsSortedAndPaddedToEight) {
  const fs::path path = test_dir() / "pad.safetensors";
  std::vector<float> a = {1, 2, 3}, b = {4};
  // Names of several lengths, so that at least one header needs padding.
  for (const std::string extra : {"", "x", "xy", "xyz", "xyzw"}) {
    write_safetensors(path.string(), {{"zz" + extra, DType::F32, {3}, a.data()},
                                      {"aa", DType::F32, {1}, b.data()}});
    const std::string bytes = read_file(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
    EXPECT_EQ(n % 8, 0u);
    const std::string header = bytes.substr(8, n);
    const size_t close = header.rfind('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
    EXPECT_LT(header.find("\"aa\""), header.find("\"zz")) << "keys not sorted: " << header;
    // Data follows the header in the given order: zz first.
    EXPECT_EQ(bytes.substr(8 + n), bytes_of(a) + bytes_of(b));
    const auto j = nlohmann::json::parse(header);
    EXPECT_EQ(j["zz" + extra]["data_offsets"], nlohmann::json::array({0, 12}));
    EXPECT_EQ(j["aa"]["data_offsets"], nlohmann::json::array({12, 16}));
  }
}

TEST(Safetensors, ReadF32Converts) {
  const fs::path path = test_dir() / "conv.safetensors";
  std::vector<uint16_t> bf16 = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f)};
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00, 0x8000, 0x0400};
  std::vector<double> f64 = {0.1, -1e300, 2.5};
  std::vector<int32_t> i32 = {1, 2};
  write_safetensors(path.string(), {{"b", DType::BF16, {2}, bf16.data()},
                                    {"h", DType::F16, {7}, f16.data()},
                                    {"d", DType::F64, {3}, f64.data()},
                                    {"i", DType::I32, {2}, i32.data()}});
  const auto f = SafetensorsFile::open(path.string());
  EXPECT_EQ(f.read_f32("b"), (std::vector<float>{1.5f, -2.0f}));
  const auto h = f.read_f32("h");
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));  // smallest f16 subnormal
  EXPECT_EQ(h[4], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(h[5]) && h[5] == 0.0f);
  EXPECT_EQ(h[6], std::ldexp(1.0f, -14));  // smallest f16 normal
  const auto d = f.read_f32("d");
  EXPECT_EQ(d[0], 0.1f);
  EXPECT_EQ(d[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(d[2], 2.5f);
  expect_error([&] { f.read_f32("i"); }, {"conv.safetensors", "'i'", "I32", "floating"});
  expect_error([&] { f.read_f32("nope"); }, {"conv.safetensors", "no tensor 'nope'"});
}

TEST(Safetensors, EmptyCheckpointIsValid) {
  const fs::path path = test_dir() / "empty.safetensors";
  write_safetensors(path.string(), {});
  const auto f = SafetensorsFile::open(path.string());
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
}

TEST(Safetensors, DataRejectsInfoFromAnotherFile) {
  const fs::path dir = test_dir();
  float x = 1;
  write_safetensors((dir / "a.safetensors").string(), {{"x", DType::F32, {}, &x}});
  write_safetensors((dir / "b.safetensors").string(), {{"x", DType::F32, {}, &x}});
  const auto a = SafetensorsFile::open((dir / "a.safetensors").string());
  const auto b = SafetensorsFile::open((dir / "b.safetensors").string());
  expect_error([&] { a.data(*b.find("x")); }, {"a.safetensors", "'x'", "does not belong"});
}

struct BadCase {
  const char* label;
  std::string bytes;
  std::vector<std::string> words;
};

const std::string kOk = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";

std::vector<BadCase> bad_cases() {
  return {
      {"short", "abcde", {"5 bytes", "shorter than the 8-byte"}},
      {"empty", "", {"0 bytes", "shorter"}},
      {"len_past_eof", le64(1000) + "{}", {"header length 1000", "past end of file"}},
      {"len_huge", le64(~0ull) + "{}", {"exceeds the limit"}},
      {"len_over_100mb", le64(100'000'001) + "{}", {"header length 100000001", "exceeds"}},
      {"not_json", st_file("{not json", 0), {"header is not valid JSON"}},
      {"nul_in_header", st_file(std::string("{}\0garbage", 10), 0), {"not valid JSON", "NUL byte at offset 2"}},
      {"not_object", st_file("[1,2]", 0), {"header is not a JSON object"}},
      {"entry_not_object", st_file(R"({"a":5})", 0), {"tensor 'a'", "not a JSON object"}},
      {"missing_dtype", st_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4),
       {"tensor 'a'", "missing 'dtype'"}},
      {"missing_shape", st_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4),
       {"tensor 'a'", "missing 'shape'"}},
      {"missing_offsets", st_file(R"({"a":{"dtype":"F32","shape":[1]}})", 4),
       {"tensor 'a'", "missing 'data_offsets'"}},
      {"unknown_field", st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4),
       {"tensor 'a'", "unknown field 'x'"}},
      {"dtype_not_string", st_file(R"({"a":{"dtype":5,"shape":[1],"data_offsets":[0,4]}})", 4),
       {"tensor 'a'", "'dtype' must be a string"}},
      {"shape_not_array", st_file(R"({"a":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4),
       {"tensor 'a'", "'shape' must be an array"}},
      {"shape_float", st_file(R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4),
       {"tensor 'a'", "'shape' must hold integers"}},
      {"shape_nested", st_file(R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", 4),
       {"tensor 'a'", "'shape' must hold integers", "an array"}},
      {"negative_dim", st_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       {"tensor 'a'", "negative dimension -1"}},
      {"dim_too_large",
       st_file(R"({"a":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})", 4),
       {"tensor 'a'", "dimension 9223372036854775808 too large"}},
      {"shape_overflow",
       st_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4),
       {"tensor 'a'", "too large"}},
      {"offsets_one", st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
       {"tensor 'a'", "array of two integers"}},
      {"offsets_strings", st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":["0","4"]}})", 4),
       {"tensor 'a'", "must hold integers"}},
      {"offset_negative", st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
       {"tensor 'a'", "negative data offset"}},
      {"offsets_past_end", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
       {"tensor 'a'", "data_offsets [0,8) past end of data area (size 4)"}},
      {"begin_after_end", st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4),
       {"tensor 'a'", "begin > end"}},
      {"size_mismatch", st_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       {"tensor 'a'", "needs 12 bytes", "span 8"}},
      {"unknown_dtype", st_file(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", 4),
       {"tensor 'a'", "unsupported dtype 'Q4'"}},
      {"overlap",
       st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       {"tensor 'b'", "overlap tensor 'a'"}},
      {"same_span",
       st_file(R"({"a":)" + kOk + R"(,"b":)" + kOk + "}", 4), {"tensor 'b'", "overlap tensor 'a'"}},
      {"gap",
       st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
       {"gap", "[4,8)", "tensor 'b'"}},
      {"gap_at_start", st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       {"gap", "[0,4)", "tensor 'a'"}},
      {"trailing_bytes", st_file(R"({"a":)" + kOk + "}", 8), {"4 trailing bytes"}},
      {"data_without_tensors", st_file("{}", 1), {"1 trailing bytes"}},
      {"duplicate_name", st_file(R"({"a":)" + kOk + R"(,"a":)" + kOk + "}", 4),
       {"duplicate key 'a'"}},
      {"duplicate_field",
       st_file(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
       {"duplicate key 'dtype'"}},
      {"metadata_not_object", st_file(R"({"__metadata__":[1]})", 0), {"__metadata__ is not"}},
      {"metadata_value_not_string", st_file(R"({"__metadata__":{"k":1}})", 0),
       {"__metadata__ value for 'k' is not a string"}},
  };
}

TEST(Safetensors, RejectsMalformedFiles) {
  const fs::path dir = test_dir();
  for (const auto& c : bad_cases()) {
    SCOPED_TRACE(c.label);
    const fs::path path = dir / (std::string(c.label) + ".safetensors");
    write_file(path, c.bytes);
    auto words = c.words;
    words.push_back(path.filename().string());
    expect_error([&] { SafetensorsFile::open(path.string()); }, words);
    // The buffer parser (used by the fuzzer) agrees with open().
    words.back() = "buf";
    expect_error([&] {
      parse_safetensors_header(reinterpret_cast<const uint8_t*>(c.bytes.data()), c.bytes.size(), "buf");
    }, words);
  }
}

TEST(Safetensors, OpenReportsMissingFileAndDirectory) {
  const fs::path dir = test_dir();
  expect_error([&] { SafetensorsFile::open((dir / "nope.safetensors").string()); },
               {"nope.safetensors", "cannot open"});
  expect_error([&] { SafetensorsFile::open(dir.string()); }, {"not a regular file"});
}

TEST(Safetensors, AcceptsUnpaddedHeaderAndZeroSizeTensorsAnywhere) {
  // Other writers need not pad, and zero-size tensors may sit between others.
  const fs::path path = test_dir() / "ok.safetensors";
  const std::string header =
      R"({"b":{"dtype":"BF16","shape":[0],"data_offsets":[4,4]},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("c":{"dtype":"I64","shape":[1,1],"data_offsets":[4,12]}})";
  write_file(path, st_file(header, 12));
  const auto f = SafetensorsFile::open(path.string());
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "a");
  EXPECT_EQ(f.tensors()[1].name, "b");
  EXPECT_EQ(f.tensors()[2].name, "c");
  EXPECT_EQ(f.find("c")->dtype, DType::I64);
}

// ---- sharded checkpoints ----------------------------------------------------------

struct Shards {
  std::vector<float> a = {1, 2, 3, 4}, b = {5, 6}, c = {7, 8, 9};
  void write(const fs::path& dir) const {
    write_safetensors((dir / "model-00001-of-00002.safetensors").string(),
                      {{"a", DType::F32, {2, 2}, a.data()}, {"b", DType::F32, {2}, b.data()}});
    write_safetensors((dir / "model-00002-of-00002.safetensors").string(),
                      {{"c", DType::F32, {3}, c.data()}});
  }
  std::map<std::string, std::string> map() const {
    return {{"a", "model-00001-of-00002.safetensors"},
            {"b", "model-00001-of-00002.safetensors"},
            {"c", "model-00002-of-00002.safetensors"}};
  }
};

TEST(SafetensorsSet, OpensIndexedShards) {
  const fs::path dir = test_dir();
  Shards s;
  s.write(dir);
  write_safetensors_index(dir.string(), s.map(), 36);
  const auto j = nlohmann::json::parse(read_file(dir / "model.safetensors.index.json"));
  EXPECT_EQ(j["metadata"]["total_size"], 36);

  for (const fs::path& p : {dir, dir / "model.safetensors.index.json"}) {
    const auto set = SafetensorsSet::open(p.string());
    EXPECT_EQ(set.files().size(), 2u);
    EXPECT_EQ(set.names(), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(set.read_f32("a"), s.a);
    EXPECT_EQ(set.read_f32("c"), s.c);
    const SafetensorsFile* file = nullptr;
    const TensorInfo* t = set.find("c", &file);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(fs::path(file->path()).filename(), "model-00002-of-00002.safetensors");
    EXPECT_EQ(bytes_at(set.data("b"), 8), bytes_of(s.b));
    EXPECT_EQ(set.find("zz"), nullptr);
    expect_error([&] { set.read_f32("zz"); }, {"no tensor 'zz'"});
  }
}

TEST(SafetensorsSet, OpensSingleFile) {
  const fs::path dir = test_dir();
  float x = 2;
  write_safetensors((dir / "model.safetensors").string(), {{"x", DType::F32, {}, &x}});
  EXPECT_EQ(SafetensorsSet::open(dir.string()).read_f32("x"), std::vector<float>{2});
  EXPECT_EQ(SafetensorsSet::open((dir / "model.safetensors").string()).size(), 1u);
}

TEST(SafetensorsSet, RejectsInconsistentIndex) {
  const fs::path dir = test_dir();
  const std::string idx = "model.safetensors.index.json";
  Shards s;
  s.write(dir);
  auto open = [&] { SafetensorsSet::open(dir.string()); };

  auto m = s.map();
  m["d"] = "model-00002-of-00002.safetensors";
  write_safetensors_index(dir.string(), m, 0);
  expect_error(open, {idx, "tensor 'd'", "model-00002-of-00002.safetensors", "does not contain"});

  m = s.map();
  m["e"] = "model-00003-of-00003.safetensors";
  write_safetensors_index(dir.string(), m, 0);
  expect_error(open, {idx, "model-00003-of-00003.safetensors", "tensor 'e'", "cannot open"});

  // 'c' also in shard 1 (beyond what the index says): ambiguous.
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(),
                    {{"a", DType::F32, {2, 2}, s.a.data()},
                     {"b", DType::F32, {2}, s.b.data()},
                     {"c", DType::F32, {3}, s.c.data()}});
  write_safetensors_index(dir.string(), s.map(), 0);
  expect_error(open, {idx, "tensor 'c'", "appears in both", "model-00001-of-00002.safetensors",
                      "model-00002-of-00002.safetensors"});

  // A corrupt shard: the message names the index, the shard, and what is wrong.
  write_file(dir / "model-00001-of-00002.safetensors", st_file("{bad", 0));
  expect_error(open, {idx, "model-00001-of-00002.safetensors", "not valid JSON"});

  write_file(dir / idx, R"({"weight_map":{"a":"../outside.safetensors"}})");
  expect_error(open, {idx, "tensor 'a'", "not a plain file name"});
  write_file(dir / idx, R"({"weight_map":{"a":"x","a":"y"}})");
  expect_error(open, {idx, "duplicate key 'a'"});
  write_file(dir / idx, R"({"weight_map":{"a":3}})");
  expect_error(open, {idx, "tensor 'a'", "not a string"});
  write_file(dir / idx, R"({"metadata":{}})");
  expect_error(open, {idx, "no 'weight_map'"});
  write_file(dir / idx, R"({"weight_map":{}})");
  expect_error(open, {idx, "empty"});
  write_file(dir / idx, "[");
  expect_error(open, {idx, "not valid JSON"});

  write_file(dir / "model.safetensors", st_file("{}", 0));
  expect_error(open, {"both", idx, "model.safetensors"});
  fs::remove(dir / idx);
  fs::remove(dir / "model.safetensors");
  expect_error(open, {dir.string(), "no model.safetensors.index.json or model.safetensors"});
}

TEST(SafetensorsSet, ShardedWriterSplitsAndReplacesLayouts) {
  const fs::path dir = test_dir();
  std::vector<float> a(10, 1.f), b(10, 2.f), c(30, 3.f), d(1, 4.f);
  const std::vector<TensorToWrite> ts = {{"a", DType::F32, {10}, a.data()},
                                         {"b", DType::F32, {10}, b.data()},
                                         {"c", DType::F32, {30}, c.data()},  // over the limit
                                         {"d", DType::F32, {1}, d.data()}};
  const auto files = write_safetensors_sharded(dir.string(), ts, 80, {{"format", "pt"}});
  EXPECT_EQ(files, (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                             "model-00002-of-00003.safetensors",
                                             "model-00003-of-00003.safetensors"}));
  auto set = SafetensorsSet::open(dir.string());
  EXPECT_EQ(set.files().size(), 3u);
  EXPECT_EQ(set.read_f32("c"), c);
  EXPECT_EQ(set.read_f32("d"), d);
  EXPECT_EQ(set.files()[0]->metadata().at("format"), "pt");
  const auto j = nlohmann::json::parse(read_file(dir / "model.safetensors.index.json"));
  EXPECT_EQ(j["metadata"]["total_size"], 204);
  EXPECT_EQ(j["weight_map"]["d"], "model-00003-of-00003.safetensors");

  // Everything fits in one file now: model.safetensors, and the old index goes away.
  EXPECT_EQ(write_safetensors_sharded(dir.string(), ts, 1 << 20),
            std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  set = SafetensorsSet::open(dir.string());
  EXPECT_EQ(set.files().size(), 1u);
  EXPECT_EQ(set.read_f32("b"), b);
}

// ---- failed writes ----------------------------------------------------------------

TEST(SafetensorsWrite, FailureLeavesExistingFileIntact) {
  const fs::path dir = test_dir();
  const fs::path path = dir / "keep.safetensors";
  float x = 1, y = 2;
  write_safetensors(path.string(), {{"x", DType::F32, {}, &x}});
  const std::string before = read_file(path);

  // The temporary cannot be created.
  fs::create_directory(path.string() + ".tmp");
  expect_error([&] { write_safetensors(path.string(), {{"y", DType::F32, {}, &y}}); },
               {"keep.safetensors", "cannot create"});
  EXPECT_EQ(read_file(path), before);
  fs::remove(path.string() + ".tmp");

  // Rejected before anything is written.
  expect_error([&] {
    write_safetensors(path.string(), {{"y", DType::F32, {}, &y}, {"y", DType::F32, {}, &y}});
  }, {"keep.safetensors", "duplicate tensor name 'y'"});
  expect_error([&] { write_safetensors(path.string(), {{"y", DType::F32, {2}, nullptr}}); },
               {"'y'", "no data"});
  expect_error([&] { write_safetensors(path.string(), {{"y", DType::F32, {-1}, &y}}); },
               {"'y'", "negative dimension"});
  expect_error([&] { write_safetensors(path.string(), {{"__metadata__", DType::F32, {}, &y}}); },
               {"reserved"});
  expect_error([&] { write_safetensors(path.string(), {{"\xff", DType::F32, {}, &y}}); },
               {"UTF-8"});
  EXPECT_EQ(read_file(path), before);
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));

  // The final rename fails (the target is a directory): the temporary is cleaned up.
  const fs::path target = dir / "target";
  fs::create_directories(target / "child");
  expect_error([&] { write_safetensors(target.string(), {{"y", DType::F32, {}, &y}}); },
               {"target", "rename"});
  EXPECT_FALSE(fs::exists(target.string() + ".tmp"));
  EXPECT_TRUE(fs::is_directory(target / "child"));

  // A directory that does not exist.
  expect_error([&] { write_safetensors((dir / "no/such/dir/f.safetensors").string(), {}); },
               {"f.safetensors", "cannot create"});
}

}  // namespace
}  // namespace st
