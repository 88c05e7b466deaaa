// Writes the seed corpora, one directory per fuzz target: small valid files made by
// the real writers (or copied from configs/ and tests/data/), plus a few invalid ones
// near the valid shape so that the fuzzers start close to the interesting edges.
//   make_corpus <corpus dir>        (fuzz/corpus; each <target>/ is emptied first)
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/token_shards.h"
#include "fuzz_util.h"
#include "io/checkpoint.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "config/model_config.h"
#include "tiny_tokenizer.h"
#include "config/run_config.h"

namespace {

namespace fs = std::filesystem;
using fuzz::join_parts;
using nlohmann::json;

std::string root = SHARDTRAIN_SOURCE_DIR;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("make_corpus: cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void put(const fs::path& path, const std::string& bytes) { fuzz::write_file(path.string(), bytes); }

std::string replace(std::string s, const std::string& from, const std::string& to) {
  if (const size_t at = s.find(from); at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// ---- safetensors -------------------------------------------------------------------

void raw_safetensors(const std::string& path, const std::string& header, size_t data_bytes) {
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  put(path, len + header + std::string(data_bytes, '\x01'));
}

void safetensors(const fs::path& d) {
  using st::DType;
  std::vector<float> f = {1.0f, -2.5f, 0.0f, 3.0f};
  std::vector<uint16_t> h = {0x3c00, 0x7c00, 0x0001, 0x8000};
  std::vector<double> f64 = {1e300, -0.5};
  std::vector<int64_t> i64 = {-1, 7};
  st::write_safetensors((d / "valid_f32").string(), {{"w", DType::F32, {2, 2}, f.data()}});
  st::write_safetensors((d / "valid_mixed").string(),
                        {{"model.norm.weight", DType::BF16, {4}, h.data()},
                         {"h", DType::F16, {2, 2}, h.data()},
                         {"d", DType::F64, {2}, f64.data()},
                         {"i", DType::I64, {1, 2}, i64.data()}},
                        {{"format", "pt"}});
  st::write_safetensors((d / "valid_scalar_empty").string(),
                        {{"s", DType::F32, {}, f.data()}, {"z", DType::I32, {0, 5}, nullptr}});
  st::write_safetensors((d / "valid_none").string(), {});
  raw_safetensors((d / "bad_overlap").string(),
                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12);
  raw_safetensors((d / "bad_dtype").string(), R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", 4);
  raw_safetensors((d / "bad_shape").string(), R"({"a":{"dtype":"F32","shape":[-1,2.5],"data_offsets":[0,4]}})", 4);
  put(d / "index.json", R"({"metadata":{"total_size":8},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
                        R"("b":"model-00002-of-00002.safetensors"}})");
}

// ---- config.json ---------------------------------------------------------------------

void config_json(const fs::path& d) {
  for (const char* preset : {"tiny", "qwen2.5-0.5b", "qwen2.5-7b"})
    put(d / (std::string("valid_") + preset + ".json"), st::hf_config_json(st::model_preset(preset)).dump(1));
  // As transformers writes it (tests/data/hf, made by scripts/make_hf_fixtures.py).
  put(d / "valid_transformers.json", slurp(root + "/tests/data/hf/untied_kv2_sharded/config.json"));
  // transformers 5: rope_parameters and layer_types; a sparse file (defaults apply).
  json v5 = st::hf_config_json(st::model_preset("tiny"));
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  v5["layer_types"] = json::array({"full_attention", "full_attention", "full_attention", "full_attention"});
  v5["head_dim"] = 32;
  put(d / "valid_v5.json", v5.dump());
  put(d / "valid_sparse.json",
      R"({"hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,"num_attention_heads":4,"vocab_size":10})");
  json bad = st::hf_config_json(st::model_preset("tiny"));
  bad["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  put(d / "bad_rope_scaling.json", bad.dump());
  bad = st::hf_config_json(st::model_preset("tiny"));
  bad["num_key_value_heads"] = 3;
  bad["hidden_size"] = 2147483648LL;
  put(d / "bad_sizes.json", bad.dump());
  put(d / "bad_types.json", R"({"model_type":"qwen2","hidden_size":64.5,"use_sliding_window":1,"vocab_size":"10"})");
}

// ---- run config (TOML + overrides) ------------------------------------------------------

void run_config(const fs::path& d) {
  put(d / "tiny.toml", slurp(root + "/configs/tiny.toml"));
  put(d / "qwen2.5-1.5b.toml", slurp(root + "/configs/qwen2.5-1.5b.toml"));
  // What a run writes as <out_dir>/config.toml, without its comment lines.
  std::istringstream saved(st::run_config_toml(st::load_run_config("", {})));
  std::string compact;
  for (std::string line; std::getline(saved, line);)
    if (!line.empty() && line[0] != '#') compact += line + "\n";
  put(d / "saved.toml", compact);
  put(d / "overrides.toml",
      join_parts({"[train]\nsteps = 20\nseq_len = 64\n[optim]\nlr = 1e-3\n[data]\nsource = \"random\"\n",
                  "train.micro_batch=4\n--optim.weight_decay=0\ndata.paths=a,b\nrun.profile=true\n"
                  "model.layers=2\ntrain.seed=9223372036854775807\n"}));
  // Regression: an override that is not UTF-8 was accepted, and the config.toml the
  // run saved did not load again (TOML strings are UTF-8).
  put(d / "regress_override_not_utf8", join_parts({"[train]\nsteps = 2\n", "data.paths=a,b\xa6\xa6Q\n"}));
  put(d / "bad_unknown.toml", "[train]\nsteps = 10\nstep = 3\n[modle]\nx = 1\n");
  put(d / "bad_types.toml",
      "train.steps = 1e3\n[model]\nheads = 3\nhidden_size = 2147483648\n[optim]\nbeta1 = nan\n"
      "[data]\npaths = [1, \"x\"]\n");
}

// ---- .npy and token files -------------------------------------------------------------

std::string npy(const std::string& descr, const std::string& shape, const std::string& data, int major = 1) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  const size_t prefix = major == 1 ? 10 : 12;
  dict.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((dict.size() >> (8 * i)) & 0xff);
  return out + dict + data;
}

template <class T>
std::string le(std::initializer_list<T> v) {
  std::string s;
  for (T x : v) s.append(reinterpret_cast<const char*>(&x), sizeof x);
  return s;
}

void npy_corpus(const fs::path& d) {
  const std::vector<float> f = {0.5f, 1.0f, -2.0f, 3.0f, 4.0f, 5.0f};
  st::write_npy_f32((d / "logits_f32.npy").string(), {2, 3}, f.data());
  put(d / "tokens_hf.npy", slurp(root + "/tests/data/hf/tied_kv1_bf16/tokens.npy"));  // written by numpy
  put(d / "ids_i4_1d.npy", npy("<i4", "5,", le<int32_t>({1, 2, 3, 4, 5})));
  put(d / "ids_i8_2d.npy", npy("<i8", "2, 3", le<int64_t>({10, 11, 12, 20, 21, 22})));
  put(d / "ids_u2_v2.npy", npy("<u2", "1, 4", le<uint16_t>({7, 8, 9, 299}), 2));
  put(d / "ids_u1_v3.npy", npy("|u1", "3,", "\x01\x02\x03", 3));
  put(d / "bad_fortran.npy", replace(npy("<i4", "2,", le<int32_t>({1, 2})), "False", "True "));
  put(d / "bad_short.npy", npy("<i8", "4, 4", le<int64_t>({1, 2, 3})));
  put(d / "bad_bigendian.npy", npy(">i4", "2,", le<int32_t>({1, 2})));
  // Regression: a shape whose element count overflows was accepted (and read past the
  // buffer); negative and huge dimensions.
  const std::string ids = le<int32_t>({1, 2, 3, 4});
  put(d / "regress_shape_overflow.npy", npy("<i4", "4611686018427387905, 4", ids));
  put(d / "regress_shape_negative.npy", npy("<i4", "-1, 4", ids));
  put(d / "regress_shape_huge.npy", npy("<i4", "99999999999999999999999, 4", ids));
  put(d / "ids.txt", "# token ids, one sequence per line\n1 2 3 4\n\n  5 6\r\n299 0 17\n");
  put(d / "bad_ids.txt", "1 2 x3\n-1 400 99999999999999999999\n");
}

// ---- NCCL logs ----------------------------------------------------------------------

void nccl_log(const fs::path& d) {
  for (const char* name : {"node1_2gpu_p2p_cumem", "node2_1gpu_socket", "node2_2gpu_efa", "node2_2gpu_ib_shm",
                           "node2_ofi_tcp_provider", "synthetic_1gpu_socket"})
    put(d / (std::string(name) + ".log"), slurp(root + "/tests/data/nccl/" + name + ".log"));
  put(d / "odd_lines.log",
      "[2026-01-01 10:00:00] host-a:12:34 [3] NCCL INFO Channel 07/1 : 2[3] -> 9[1] [receive] via NET/IB/1(0)/GDRDMA/Shared\n"
      "host-a:12:34 [3] NCCL WARN NET/OFI Selected Provider is tcp (found 1 nics)\n"
      "NCCL INFO\n"
      "Channel 00/02 :    0   1\n"
      "host:1:2 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct\n"
      "host:1:2 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 4 localRanks 4 localRank 0 MNNVL 0\n"
      "x:y:z NCCL INFO NET/Plugin: Could not find: libnccl-net.so\n");
  // Regression: counts too large for an int (signed overflow in int_after; std::stoi
  // threw std::out_of_range out of parse_nccl_log).
  put(d / "regress_huge_numbers.log",
      "h:1:2 [0] NCCL INFO comm 0x1 rank 0 nRanks 99999999999 nNodes 888888888888 localRanks 1\n"
      "h:1:2 [0] NCCL INFO Channel 99999999999/0 : 0[0] -> 1[4294967296] via P2P/CUMEM/read\n");
}

// ---- tokenizer ---------------------------------------------------------------------

void tokenizer(const fs::path& d) {
  const st::testing::TinyTokenizer t = st::testing::tiny_tokenizer();
  put(d / "tokenizer_json", join_parts({st::testing::tokenizer_json(t), "Hello the world <|im_start|>and 12's\n"}));
  put(d / "tokenizer_json_no_nfc", st::testing::tokenizer_json(t, false));
  put(d / "vocab_merges",
      join_parts({st::testing::vocab_json(t), st::testing::merges_txt(t), st::testing::tokenizer_config_json(t), "in the end\xC3\xA9"}));
  // Near misses: a merge naming a missing token; an added token that lstrips.
  st::testing::TinyTokenizer bad = t;
  bad.merges.emplace_back("q", "zz");
  put(d / "bad_merge", st::testing::tokenizer_json(bad));
  put(d / "bad_added", replace(st::testing::tokenizer_json(t), "\"lstrip\":false", "\"lstrip\":true"));
  // Regression: an id just below the old limit of 2^30 made load allocate tables of
  // 2^30 entries (32 GiB).
  // Regression: a field read with json::value() that held another type than a string
  // threw a json::type_error out of Tokenizer::load instead of an st::Error.
  put(d / "regress_behavior_not_string",
      replace(st::testing::tokenizer_json(t, false), "\"behavior\":\"Isolated\"", "\"behavior\":1073741823"));
  put(d / "regress_class_not_string",
      join_parts({st::testing::vocab_json(t), st::testing::merges_txt(t),
                  replace(st::testing::tokenizer_config_json(t), "\"Qwen2Tokenizer\"", "[\"Qwen2Tokenizer\"]")}));
  st::testing::TinyTokenizer big = t;
  big.added[1].second = (1 << 30) - 1;
  put(d / "regress_huge_added_id", st::testing::tokenizer_json(big, false));
  big = t;
  big.vocab["zz"] = (1 << 30) - 1;
  put(d / "regress_huge_vocab_id", join_parts({st::testing::vocab_json(big), st::testing::merges_txt(big), st::testing::tokenizer_config_json(big)}));
}

void tokenizer_encode(const fs::path& d) {
  put(d / "ascii", "Hello world, the end. It's 2024!\n\n  and   then\tin\r\n");
  put(d / "added", "<|im_start|>user\nhi<|im_end|><|endoftext|><|endoftext");
  put(d / "unicode", "\xE4\xBD\xA0\xE5\xA5\xBD \xC3\xA9t\xC3\xA9 caf\x65\xCC\x81 \xEA\xB0\x80 \xF0\x9F\x98\x80 \xE2\x84\xAA");
  put(d / "invalid_utf8", "ab\xC3(\xE2\x82\xED\xA0\x80\xF4\x90\x80\x80\xC0\xAF\xFF\xFEz");
  put(d / "digits_marks", "12345 \xCC\x81\xCC\x81x\xE1\x85\xA1\xE1\x86\xA8 ''s 'LL");
}

// ---- token shards and index.json ------------------------------------------------------

std::vector<std::string> prepared(const fs::path& tmp, const std::vector<std::vector<int32_t>>& shards, uint32_t vocab,
                                  int32_t eos) {
  st::TokenIndex x;
  x.tokenizer = "tiny byte-level BPE";
  x.tokenizer_dir = "/tokenizers/tiny";
  x.vocab_size = vocab;
  x.eos_id = eos;
  x.input_format = "jsonl";
  x.text_field = "text";
  x.shard_tokens = 8;
  std::vector<std::string> files;
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "shard-%05zu.bin", i);
    st::TokenShardWriter w((tmp / name).string(), vocab);
    w.append(shards[i].data(), shards[i].size());
    const uint64_t h = w.finish();
    x.shards.push_back({name, shards[i].size(), st::xxh3_64_hex(h)});
    x.tokens += shards[i].size();
    files.push_back(slurp((tmp / name).string()));
  }
  x.documents = 2;
  x.inputs.push_back({"/data/a.jsonl", 40, 2, x.tokens});
  files.insert(files.begin(), st::token_index_json(x));
  return files;
}

void token_shards(const fs::path& d, const fs::path& tmp) {
  constexpr size_t kHeader = st::kTokenShardHeaderBytes;
  put(d / "two_shards", join_parts(prepared(tmp, {{1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 299}}, 300, 299)));
  put(d / "one_shard", join_parts(prepared(tmp, {{0, 1, 2}}, 3, 2)));
  put(d / "no_shards", join_parts(prepared(tmp, {}, 300, 0)));
  auto files = prepared(tmp, {{5, 6, 7}}, 300, 7);
  files[1][8] = 2;  // format version 2
  put(d / "bad_version", join_parts(files));
  files = prepared(tmp, {{5, 6, 7}}, 300, 7);
  files[1][kHeader] ^= 1;  // the first id 5 -> 4: the checksum no longer matches
  files[0] = replace(files[0], "shard-00000.bin", "../shard-00000.bin");
  put(d / "bad_checksum_name", join_parts(files));
  // Regression: integers given as floats out of range (undefined behaviour in the
  // conversion), and an integer too large for its field.
  files = prepared(tmp, {{5, 6, 7}}, 300, 7);
  put(d / "regress_float_version", join_parts({replace(files[0], "\"version\": 1", "\"version\": 1e300"), files[1]}));
  put(d / "regress_float_eos", join_parts({replace(files[0], "\"eos_id\": 7", "\"eos_id\": -1e300"), files[1]}));
  put(d / "regress_eos_wraps", join_parts({replace(files[0], "\"eos_id\": 7", "\"eos_id\": 4294967303"), files[1]}));
}

// ---- checkpoint manifests -------------------------------------------------------------

void checkpoint(const fs::path& d, const fs::path& tmp) {
  st::CheckpointManifest m;
  m.step = 40;
  m.shard_world = 2;
  m.units = {{"embed", 32768, 32768, 16384}, {"layers.0", 197376, 197376, 98688}, {"final", 128, 128, 64}};
  m.model = {{"hidden_size", 128}, {"num_hidden_layers", 1}, {"vocab_size", 256}};
  m.run_config = "[train]\nsteps = 40\n";
  m.seed = 1234;
  m.tokens_seen = 40 * 16 * 128;
  std::vector<std::string> files = {""};
  const std::vector<float> w = {1, 2, 3, 4};
  for (int r = 0; r < m.shard_world; ++r) {
    const std::string name = st::checkpoint_shard_file(r, m.shard_world);
    st::write_safetensors((tmp / name).string(), {{"embed.master", st::DType::F32, {2}, w.data() + 2 * r}});
    m.files.push_back({name, fs::file_size(tmp / name), st::file_xxh3((tmp / name).string())});
    files.push_back(slurp((tmp / name).string()));
  }
  files[0] = m.to_json().dump(1);
  put(d / "two_shards", join_parts(files));
  st::CheckpointManifest empty;
  put(d / "manifest_only", empty.to_json().dump());
  files[0] = replace(m.to_json().dump(1), "\"step\": 40", "\"step\": -1");
  put(d / "bad_step", join_parts(files));
  files[0] = replace(m.to_json().dump(1), "\"bytes\": ", "\"bytes\": 1");
  put(d / "bad_size", join_parts(files));
  // Regression: integers given as floats out of range (undefined behaviour in the
  // conversion); a listed file outside the checkpoint directory (its size and hash
  // were checked instead of the shard's).
  files[0] = replace(m.to_json().dump(1), "\"step\": 40", "\"step\": 1e300");
  put(d / "regress_float_step", join_parts(files));
  files[0] = replace(m.to_json().dump(1), "\"tokens_seen\": 81920", "\"tokens_seen\": -1.5e300");
  put(d / "regress_float_tokens_seen", join_parts(files));
  files[0] = replace(m.to_json().dump(1), "\"shard-00001-of-00002", "\"../step-7/shard-00001-of-00002");
  put(d / "regress_name_outside", join_parts(files));
}

// ---- cluster files ------------------------------------------------------------------

void cluster_file(const fs::path& d) {
  // The recipes, with their run config pointing at the one the target writes beside them.
  for (const char* name : {"eks-g6-efa", "eks-g6-efa-kuberay"})
    put(d / (std::string(name) + ".toml"),
        replace(slurp(root + "/configs/deploy/" + name + ".toml"), "\"../qwen2.5-1.5b.toml\"", "\"run.toml\""));
  put(d / "minimal.toml",
      "[cluster]\nname = \"c1\"\nregion = \"us-east-1\"\nzones = [\"us-east-1a\", \"us-east-1b\"]\n"
      "[nodes.gpu]\ninstance_type = \"g6.12xlarge\"\n[image]\nrepository = \"r\"\nallow_unpinned = true\n"
      "[workload.resources]\ngpus = 2\nshm_gib = 8\n"
      "[train.set]\n\"train.device\" = \"cpu\"\n\"data.paths\" = [\"a\", \"b\"]\n\"optim.lr\" = 1.5e-4\n"
      "[fabric]\nenv = { FI_EFA_FORK_SAFE = \"1\" }\n");
  put(d / "bad_keys.toml",
      "[cluster]\nname = \"Bad_Name\"\nregion = 3\n[nodes.gpu]\ninstance_type = \"p9.huge\"\ncount = 0\n"
      "[workload]\nengine = \"slurm\"\n[train.set]\ntrain = { steps = 1 }\n");
}

void fresh(const fs::path& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus <corpus dir>\n");
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path tmp = fs::path(fuzz::scratch_dir()) / "work";
  fs::create_directories(tmp);
  const std::vector<std::pair<std::string, std::function<void(const fs::path&)>>> targets = {
      {"safetensors", safetensors},
      {"config_json", config_json},
      {"run_config", run_config},
      {"npy", npy_corpus},
      {"nccl_log", nccl_log},
      {"tokenizer", tokenizer},
      {"tokenizer_encode", tokenizer_encode},
      {"token_shards", [&](const fs::path& d) { token_shards(d, tmp); }},
      {"checkpoint", [&](const fs::path& d) { checkpoint(d, tmp); }},
      {"cluster_file", cluster_file},
  };
  for (const auto& [name, make] : targets) {
    fresh(out / name);
    make(out / name);
  }
  return 0;
}
