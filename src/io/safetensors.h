// Reading and writing Hugging Face safetensors checkpoints.
//
// A file is: an 8-byte little-endian header length N, N bytes of a JSON object, then
// the data area. Each JSON entry (except "__metadata__") names one tensor with its
// dtype, shape and [begin, end) byte offsets into the data area. Checkpoints are our
// only contact with weights from outside, so the reader trusts nothing: every
// inconsistency is an st::Error naming the file and, where there is one, the tensor.
//
// Reading memory-maps the file read-only; tensor data is never copied unless asked
// for (read_f32). Data pointers are NOT necessarily aligned to the element size (the
// format does not align tensors), so copy with memcpy rather than casting.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"

namespace st {

// The format's spelling of a dtype ("F32", "BF16", ...).
const char* safetensors_dtype_name(DType t);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // empty for a scalar
  uint64_t begin = 0;          // byte offsets relative to the data area
  uint64_t end = 0;

  uint64_t numel() const;      // 1 for a scalar, 0 if any dim is 0
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;              // sorted by begin (file order)
  std::map<std::string, std::string> metadata;  // "__metadata__", empty if absent
  uint64_t data_start = 0;                      // 8 + N: where the data area begins
  uint64_t data_size = 0;                       // bytes in the data area
};

// Parses and validates a whole file held in memory (header and data area; the data
// bytes themselves are not read). `name_for_errors` prefixes every error message.
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size,
                                           const std::string& name_for_errors);

// Converts `numel` elements of a floating dtype (F32, F64, BF16, F16) at `src` to
// float; `src` need not be aligned. Integer dtypes are an error naming `what`.
std::vector<float> to_f32(const void* src, DType dtype, uint64_t numel, const std::string& what);

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates it; throws st::Error naming the path.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  // Start of the tensor's bytes inside the mapping; `t` must come from this file.
  const void* data(const TensorInfo& t) const;
  // The named tensor converted to float (BF16/F16/F32/F64); throws if absent.
  std::vector<float> read_f32(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  static SafetensorsFile open_unclassified(const std::string& path);  // open(), errors as thrown
  void unmap();

  std::string path_;
  const uint8_t* base_ = nullptr;  // the mapping (nullptr for an empty mapping)
  size_t size_ = 0;
  SafetensorsHeader header_;
  std::unordered_map<std::string, size_t> by_name_;  // name -> index in tensors()
};

// Parses a model.safetensors.index.json text into its weight_map (tensor -> shard
// file name). Shard names must be plain file names (no directories).
std::map<std::string, std::string> parse_safetensors_index(const std::string& text,
                                                           const std::string& name_for_errors);

// A checkpoint that may be split across files, looked up by tensor name.
class SafetensorsSet {
 public:
  // `path` is one of: a directory holding model.safetensors.index.json (sharded) or
  // model.safetensors; an index .json file; a .safetensors file.
  static SafetensorsSet open(const std::string& path);

  const std::string& source() const { return source_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  size_t size() const { return by_name_.size(); }
  std::vector<std::string> names() const;  // sorted
  // nullptr if absent; `file` (if given) receives the file holding the tensor.
  const TensorInfo* find(const std::string& name, const SafetensorsFile** file = nullptr) const;
  const void* data(const std::string& name) const;  // throws if absent
  std::vector<float> read_f32(const std::string& name) const;

 private:
  static SafetensorsSet open_unclassified(const std::string& path);  // open(), errors as thrown
  struct Where {
    size_t file;
    const TensorInfo* info;
  };
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Where> by_name_;
};

// ---- writing -----------------------------------------------------------------------

struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel * dtype_size bytes; may be null when that is 0
};

// Writes one file: header keys sorted, data in the given order, header padded with
// spaces to a multiple of 8. Goes through "<path>.tmp" + fsync + rename, so `path` is
// either the old file or the complete new one, never a partial write.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes <dir>/model.safetensors.index.json ({"metadata":{"total_size":..},
// "weight_map":{..}}), atomically like write_safetensors.
void write_safetensors_index(const std::string& dir,
                             const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size);

// Splits `tensors` (in order) into files of at most `max_shard_bytes` of data each (a
// tensor larger than that gets a file of its own). One file -> <dir>/model.safetensors;
// several -> <dir>/model-00001-of-0000N.safetensors ... plus the index, written last
// so that a reader never sees an index naming shards not yet written. Returns the
// file names written (shards only, in order).
std::vector<std::string> write_safetensors_sharded(
    const std::string& dir, const std::vector<TensorToWrite>& tensors, uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace st
