// Malformed input of every kind a user hands the binary (run configs, model files,
// token files, data paths, command lines), none of it used by the other tests: each is
// refused with one clear line naming what is wrong and the documented exit code, never
// an internal error, a crash or a sanitizer report (scripts/sanitize.sh runs this test
// under ASan + UBSan), and before any large allocation (it ends in seconds).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/shell.h"
#include "support/temp_dir.h"

namespace {
namespace fs = std::filesystem;

// One directory for the whole process, emptied once.
fs::path root() {
  static const fs::path p = st::testing::temp_dir("hostile");
  return p;
}

fs::path put(const std::string& name, const std::string& bytes) {
  const fs::path p = root() / name;
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file: 8-byte little-endian header length, the header, the data.
std::string safetensors(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

// A .npy version 1.0 file with this header dict.
std::string npy(const std::string& dict, const std::string& data) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string s = "\x93NUMPY\x01";
  s += '\0';
  s += static_cast<char>(h.size() & 0xff);
  s += static_cast<char>(h.size() >> 8);
  return s + h + data;
}

// A model directory: the tiny fixture's config.json with `config` in its place when
// given, and `weights` as model.safetensors.
fs::path model_dir(const std::string& name, const std::string& config, const std::string& weights) {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "tied_kv2_f32";
  const fs::path d = root() / name;
  fs::create_directories(d);
  if (config.empty())
    fs::copy_file(fx / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
  else
    std::ofstream(d / "config.json") << config;
  if (!weights.empty()) std::ofstream(d / "model.safetensors", std::ios::binary) << weights;
  return d;
}

struct Case {
  std::string what;    // the input, in words
  std::string args;    // shardtrain's arguments
  int code;            // the documented exit code
  std::string names;   // a part of the message that names the culprit
};

const std::string kTiny =
    " --model.preset=tiny --model.layers=1 --model.hidden_size=32 --model.intermediate_size=64"
    " --train.seq_len=16 --train.micro_batch=2 --train.steps=1 --run.progress=off";

std::vector<Case> cases() {
  const fs::path fx = fs::path(SHARDTRAIN_TEST_DATA) / "hf" / "tied_kv2_f32";
  const std::string tokens = (fx / "tokens.npy").string();
  const std::string out = " --run.out_dir=" + (root() / "runs").string();
  std::vector<Case> c;
  auto train = [&](const std::string& more) { return "train" + kTiny + out + more; };

  // ---- run configs (TOML)
  c.push_back({"binary garbage as a run config",
               "train --config " + put("garbage.toml", std::string("\x00\xff\xfe[[\x01", 6)).string(), 2,
               "garbage.toml"});
  c.push_back({"arrays nested 100000 deep",
               "train --config " + put("deep.toml", "a = " + std::string(100000, '[')).string(), 2, "deep.toml"});
  c.push_back({"an integer too large for TOML",
               "train --config " + put("bigint.toml", "[train]\nsteps = 99999999999999999999999\n").string(), 2,
               "bigint.toml"});
  c.push_back({"a string where a number goes",
               "train --config " + put("lr.toml", "[optim]\nlr = \"fast\"\n").string(), 2, "optim.lr"});
  c.push_back({"a table where a number goes",
               "train --config " + put("table.toml", "[train]\nsteps = { a = 1 }\n").string(), 2, "train.steps"});
  c.push_back({"a section that is a value", "train --config " + put("sect.toml", "train = 3\n").string(), 2,
               "train"});
  c.push_back({"a directory as the run config", "train --config " + root().string(), 2, root().string()});
  c.push_back({"a run config that does not exist", "train --config " + (root() / "nope.toml").string(), 2,
               "nope.toml"});

  // ---- command lines
  c.push_back({"a step count past 64 bits", train(" --train.steps=99999999999999999999"), 2, "train.steps"});
  c.push_back({"a negative sequence length", train(" --train.seq_len=-1"), 2, "train.seq_len"});
  c.push_back({"an empty preset", train(" --model.preset="), 2, "model.preset"});
  c.push_back({"a hexadecimal learning rate of infinity", train(" --optim.lr=0x1p99999"), 2, "optim.lr"});
  c.push_back({"a non-negative ignore index", train(" --data.ignore_index=5"), 2, "data.ignore_index"});
  c.push_back({"a sequence too long for the model", train(" --train.seq_len=1000000000"), 2, "train.seq_len"});
  c.push_back({"a key with a control byte (printed escaped)", train(std::string(" '--train.st\x1b" "eps=1'")), 2,
               "unknown key 'train.st\\x1beps'"});
  c.push_back({"heads that do not divide the hidden size", train(" --model.heads=5"), 2, "model.heads"});

  // ---- model files
  c.push_back({"config.json that is a list", train(" --model.config=" + model_dir("cfg_list", "[1, 2]", "").string()),
               3, "config.json"});
  c.push_back({"config.json with a hidden size of 1e30",
               train(" --model.config=" +
                     model_dir("cfg_huge", R"({"hidden_size": 1e30, "intermediate_size": 128, "num_hidden_layers": 1,
                       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300})", "").string()),
               3, "hidden_size"});
  c.push_back({"config.json with zero heads",
               train(" --model.config=" +
                     model_dir("cfg_zero", R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                       "num_attention_heads": 0, "num_key_value_heads": 0, "vocab_size": 300})", "").string()),
               3, "num_attention_heads"});
  c.push_back({"safetensors whose header length passes the end of the file",
               "score --init-from " + model_dir("st_len", "", le64(1ull << 40) + "{}").string() + " --tokens " + tokens,
               3, "model.safetensors"});
  c.push_back({"safetensors whose header length is 2^64-1",
               "score --init-from " + model_dir("st_len64", "", le64(~0ull) + "{}").string() + " --tokens " + tokens, 3,
               "model.safetensors"});
  c.push_back({"safetensors with a dtype it cannot read",
               "score --init-from " +
                   model_dir("st_dtype", "",
                             safetensors(R"({"model.norm.weight":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})",
                                         "abcd"))
                       .string() +
                   " --tokens " + tokens,
               3, "model.safetensors"});
  c.push_back({"safetensors whose tensors overlap",
               "score --init-from " +
                   model_dir("st_overlap", "",
                             safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                         std::string(12, '\0')))
                       .string() +
                   " --tokens " + tokens,
               3, "model.safetensors"});
  c.push_back({"a shape whose element count overflows",
               "score --init-from " +
                   model_dir("st_shape", "",
                             safetensors(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})",
                                         std::string(8, '\0')))
                       .string() +
                   " --tokens " + tokens,
               3, "model.safetensors"});
  c.push_back({"a model directory without weights",
               "score --init-from " + model_dir("no_weights", "", "").string() + " --tokens " + tokens, 3,
               "no_weights"});

  // ---- token files
  const std::string fxm = " --init-from " + fx.string();
  c.push_back({"token ids stored as floats",
               "score" + fxm + " --tokens " + put("f4.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }",
                                                               std::string(16, '\0'))).string(),
               3, "f4.npy"});
  c.push_back({"token ids in three dimensions",
               "score" + fxm + " --tokens " +
                   put("3d.npy", npy("{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2, 2), }",
                                     std::string(16, '\0'))).string(),
               3, "3d.npy"});
  c.push_back({"a .npy header that is not a dict",
               "score" + fxm + " --tokens " + put("nodict.npy", npy("[1, 2, 3]", "")).string(), 3,
               "nodict.npy: header has no 'descr': [1, 2, 3]\n"});
  c.push_back({"a token id past the vocabulary",
               "score" + fxm + " --tokens " + put("oov.txt", "1 2 3 2147483647\n").string(), 3, "oov.txt"});
  c.push_back({"a token id past 32 bits",
               "score" + fxm + " --tokens " + put("big.txt", "1 2 99999999999999999999\n").string(), 3, "big.txt"});
  c.push_back({"an empty token file", "score" + fxm + " --tokens " + put("empty.txt", "").string(), 3, "empty.txt"});

  // ---- data paths
  const fs::path shards = root() / "shards";
  fs::create_directories(shards);
  std::ofstream(shards / "index.json") << R"({"version": 1, "shards": [{"file": "shard-00000.bin", "tokens": 100}]})";
  c.push_back({"token shards whose index lists a missing shard",
               train(" --data.source=tokens --data.paths=" + shards.string()), 3, "shards"});
  const fs::path empty_dir = root() / "empty_dir";
  fs::create_directories(empty_dir);
  c.push_back({"a text corpus that is an empty directory",
               train(" --data.source=text --data.paths=" + empty_dir.string()), 3, "empty_dir"});
  c.push_back({"a device file as the text corpus", train(" --data.source=text --data.paths=/dev/zero"), 3,
               "/dev/zero"});
  const fs::path fifo = root() / "fifo";
  mkfifo(fifo.c_str(), 0600);
  c.push_back({"a named pipe as the text corpus", train(" --data.source=text --data.paths=" + fifo.string()), 3,
               "fifo"});
  c.push_back({"a token-shard directory that is a file",
               train(" --data.source=tokens --data.paths=" + put("notadir", "x").string()), 3, "notadir"});
  return c;
}

TEST(HostileInputs, EachIsRefusedWithItsExitCodeAndNoInternalError) {
  for (const Case& k : cases()) {
    const auto r = st::testing::run_shell("timeout 60 " + std::string(SHARDTRAIN_BINARY) + " " + k.args + " </dev/null");
    SCOPED_TRACE(k.what + ": shardtrain " + k.args.substr(0, 300));
    EXPECT_EQ(r.code, k.code) << r.out;
    EXPECT_NE(r.out.find("error: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(k.names), std::string::npos) << "should name '" << k.names << "': " << r.out;
    EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("Sanitizer"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("runtime error:"), std::string::npos) << r.out;  // UBSan
    EXPECT_LT(r.seconds, 30) << r.out;  // refused up front, not after working
  }
}

}  // namespace
