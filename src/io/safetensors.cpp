#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "core/error.h"

namespace st {

// The format is little-endian; we read and write it by memcpy.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The reference implementation refuses larger headers; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

bool parse_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> kNames[] = {
      {"F32", DType::F32}, {"F64", DType::F64}, {"BF16", DType::BF16},
      {"F16", DType::F16}, {"I32", DType::I32}, {"I64", DType::I64}};
  for (const auto& [name, t] : kNames)
    if (s == name) {
      *out = t;
      return true;
    }
  return false;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s += ']';
}

// A JSON value for an error message. Containers are only named: dumping one is
// recursive, and a hostile header can nest millions deep.
std::string brief(const json& v) {
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  std::string s = v.dump();
  return s.size() > 64 ? s.substr(0, 64) + "..." : s;
}

std::string span_str(uint64_t b, uint64_t e) {
  std::string s = "[";
  s += std::to_string(b);
  s += ',';
  s += std::to_string(e);
  return s += ')';
}

// numel * dtype size, or false on overflow. A zero dim makes the product 0 even when
// the other dims alone would overflow.
bool byte_count(const std::vector<int64_t>& shape, DType t, uint64_t* out) {
  uint64_t n = dtype_size(t);
  bool overflow = false;
  for (int64_t d : shape) {
    if (d == 0) {
      *out = 0;
      return true;
    }
    overflow |= __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n);
  }
  *out = n;
  return !overflow;
}

// nlohmann::json keeps the last of duplicate keys silently; a checkpoint with two
// entries for one tensor is corrupt, so the parse callback rejects them at any depth.
json parse_json_strict(const char* begin, const char* end, const std::string& who,
                       const char* what) {
  // nlohmann stops at a NUL as if the text ended there, which would let anything
  // follow it; JSON text never holds a raw NUL, so refuse one outright.
  if (const void* nul = std::memchr(begin, 0, static_cast<size_t>(end - begin)))
    fail(who, ": ", what, " is not valid JSON: NUL byte at offset ",
         static_cast<const char*>(nul) - begin);
  std::vector<std::set<std::string>> open_objects;
  auto on_event = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (ev == json::parse_event_t::key) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second)
        fail(who, ": ", what, " has duplicate key '", key, "'");
    }
    return true;
  };
  try {
    return json::parse(begin, end, on_event);
  } catch (const json::exception& e) {
    fail(who, ": ", what, " is not valid JSON: ", e.what());
  }
}

uint64_t json_offset(const json& v, const std::string& ctx) {
  ST_CHECK(v.is_number_integer(), ctx, ": data_offsets must hold integers, got ", brief(v));
  ST_CHECK(v.is_number_unsigned(), ctx, ": negative data offset ", brief(v));
  return v.get<uint64_t>();
}

TensorInfo parse_entry(const std::string& who, const std::string& name, const json& e,
                       uint64_t data_size) {
  const std::string ctx = who + ": tensor '" + name + "'";
  ST_CHECK(e.is_object(), ctx, ": entry is not a JSON object");
  for (const auto& [key, _] : e.items())
    ST_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", ctx, ": unknown field '",
             key, "'");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    ST_CHECK(e.contains(key), ctx, ": missing '", key, "'");

  TensorInfo t;
  t.name = name;
  const json& dt = e["dtype"];
  ST_CHECK(dt.is_string(), ctx, ": 'dtype' must be a string, got ", brief(dt));
  const auto& dts = dt.get_ref<const std::string&>();
  ST_CHECK(parse_dtype(dts, &t.dtype), ctx, ": unsupported dtype '", dts,
           "' (supported: F32, F64, BF16, F16, I32, I64)");

  const json& sh = e["shape"];
  ST_CHECK(sh.is_array(), ctx, ": 'shape' must be an array, got ", brief(sh));
  for (const json& d : sh) {
    ST_CHECK(d.is_number_integer(), ctx, ": 'shape' must hold integers, got ", brief(d));
    ST_CHECK(d.is_number_unsigned(), ctx, ": negative dimension ", brief(d), " in shape");
    const uint64_t v = d.get<uint64_t>();
    ST_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), ctx,
             ": dimension ", v, " too large");
    t.shape.push_back(static_cast<int64_t>(v));
  }

  const json& off = e["data_offsets"];
  ST_CHECK(off.is_array() && off.size() == 2, ctx,
           ": 'data_offsets' must be an array of two integers, got ", brief(off));
  t.begin = json_offset(off[0], ctx);
  t.end = json_offset(off[1], ctx);
  ST_CHECK(t.begin <= t.end, ctx, ": data_offsets ", span_str(t.begin, t.end),
           " has begin > end");
  ST_CHECK(t.end <= data_size, ctx, ": data_offsets ", span_str(t.begin, t.end),
           " past end of data area (size ", data_size, ")");

  uint64_t want = 0;
  ST_CHECK(byte_count(t.shape, t.dtype, &want), ctx, ": shape ", shape_str(t.shape),
           " is too large");
  ST_CHECK(want == t.nbytes(), ctx, ": shape ", shape_str(t.shape), " x ",
           safetensors_dtype_name(t.dtype), " needs ", want, " bytes but data_offsets ",
           span_str(t.begin, t.end), " span ", t.nbytes());
  return t;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float f = std::ldexp(static_cast<float>(man), -24);
    return sign ? -f : f;
  }
  // Rebias the exponent (15 -> 127); all-ones stays all-ones for inf/NaN.
  const uint32_t e32 = exp == 0x1f ? 0xffu : exp + 112;
  return std::bit_cast<float>(sign | (e32 << 23) | (man << 13));
}

// Creates "<path>.tmp"; commit() makes it `path`. Until then `path` is untouched, and
// a failure (or an exception unwinding past us) removes the temporary.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(path_, ": cannot create '", tmp_, "': ", std::strerror(errno));
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  void write(const void* data, uint64_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      // Linux writes at most ~2 GiB per call; large tensors go in pieces.
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
      const ssize_t w = ::write(fd_, p, chunk);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail(path_, ": write to '", tmp_, "' failed: ", std::strerror(errno));
      p += w;
      n -= static_cast<uint64_t>(w);
    }
  }

  void commit() {
    if (::fsync(fd_) != 0) fail(path_, ": fsync of '", tmp_, "' failed: ", std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) fail(path_, ": close of '", tmp_, "' failed: ", std::strerror(errno));
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      fail(path_, ": cannot rename '", tmp_, "' into place: ", std::strerror(errno));
    committed_ = true;
    // Make the rename itself durable. Best effort: the new file is complete either way.
    fs::path dir = fs::path(path_).parent_path();
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Checks names, shapes and data pointers; returns each tensor's byte count.
std::vector<uint64_t> validate_for_write(const std::string& who,
                                         const std::vector<TensorToWrite>& tensors) {
  std::vector<uint64_t> sizes;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    ST_CHECK(!t.name.empty(), who, ": tensor with an empty name");
    ST_CHECK(t.name != "__metadata__", who, ": '__metadata__' is reserved, not a tensor name");
    ST_CHECK(names.insert(t.name).second, who, ": duplicate tensor name '", t.name, "'");
    for (int64_t d : t.shape)
      ST_CHECK(d >= 0, who, ": tensor '", t.name, "' has negative dimension in shape ",
               shape_str(t.shape));
    uint64_t n = 0;
    ST_CHECK(byte_count(t.shape, t.dtype, &n), who, ": tensor '", t.name, "' shape ",
             shape_str(t.shape), " is too large");
    ST_CHECK(n == 0 || t.data != nullptr, who, ": tensor '", t.name, "' has no data");
    sizes.push_back(n);
  }
  return sizes;
}

void check_shard_name(const std::string& who, const std::string& tensor, const std::string& file) {
  // Shards live next to the index; anything else could reach outside the checkpoint.
  ST_CHECK(!file.empty() && file != "." && file != ".." &&
               file.find('/') == std::string::npos && file.find('\0') == std::string::npos,
           who, ": tensor '", tensor, "' maps to '", file,
           "', which is not a plain file name in the checkpoint directory");
}

void write_text_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::F8E4M3: return "F8_E4M3";
    case DType::F8E5M2: return "F8_E5M2";
  }
  return "?";
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// ---- parsing ----------------------------------------------------------------------

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size,
                                           const std::string& who) {
  ST_CHECK(size >= 8, who, ": file is ", size, " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  ST_CHECK(n <= kMaxHeaderBytes, who, ": header length ", n, " exceeds the limit of ",
           kMaxHeaderBytes, " bytes");
  ST_CHECK(n <= size - 8, who, ": header length ", n, " past end of file (file size ", size,
           ")");

  const auto* text = reinterpret_cast<const char*>(data + 8);
  const json j = parse_json_strict(text, text + n, who, "header");
  ST_CHECK(j.is_object(), who, ": header is not a JSON object");

  SafetensorsHeader h;
  h.data_start = 8 + n;
  h.data_size = size - h.data_start;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      ST_CHECK(value.is_object(), who, ": __metadata__ is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        ST_CHECK(mv.is_string(), who, ": __metadata__ value for '", mk, "' is not a string");
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(parse_entry(who, key, value, h.data_size));
  }

  // The spans sorted by begin must tile the data area exactly: no overlap (two tensors
  // aliasing bytes), no gap and no trailing bytes (the format indexes every byte).
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : h.tensors) {
    ST_CHECK(t.begin >= pos, who, ": tensor '", t.name, "' data_offsets ",
             span_str(t.begin, t.end), " overlap tensor '", prev ? prev->name : "", "' ",
             prev ? span_str(prev->begin, prev->end) : "");
    ST_CHECK(t.begin == pos, who, ": gap in data area: bytes ", span_str(pos, t.begin),
             " before tensor '", t.name, "' belong to no tensor");
    pos = t.end;
    prev = &t;
  }
  ST_CHECK(pos == h.data_size, who, ": data area has ", h.data_size - pos,
           " trailing bytes after the last tensor (bytes ", span_str(pos, h.data_size),
           " belong to no tensor)");
  return h;
}

std::vector<float> to_f32(const void* src, DType dtype, uint64_t numel, const std::string& what) {
  std::vector<float> out(numel);
  const auto* p = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case DType::F32:
      if (numel) std::memcpy(out.data(), p, numel * 4);
      return out;
    case DType::F64:
      for (uint64_t i = 0; i < numel; ++i) {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      return out;
    case DType::BF16:
    case DType::F16:
      for (uint64_t i = 0; i < numel; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      return out;
    case DType::I32:
    case DType::I64:
    case DType::F8E4M3:  // never parsed from a file (parse_dtype)
    case DType::F8E5M2: break;
  }
  fail(what, ": dtype ", safetensors_dtype_name(dtype), " is not a floating-point type");
}

// ---- SafetensorsFile --------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // A file that cannot be read or is malformed is a data error (exit 3).
  return classify_errors(ErrorKind::Data, [&] { return open_unclassified(path); });
}

SafetensorsFile SafetensorsFile::open_unclassified(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  f.size_ = static_cast<size_t>(sb.st_size);
  if (f.size_ > 0) {  // mmap refuses length 0; the parser reports the short file
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(path, ": mmap failed: ", std::strerror(err));
    }
    f.base_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  f.header_ = parse_safetensors_header(f.base_, f.size_, path);
  for (size_t i = 0; i < f.header_.tensors.size(); ++i)
    f.by_name_.emplace(f.header_.tensors[i].name, i);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      header_(std::move(o.header_)),
      by_name_(std::move(o.by_name_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    header_ = std::move(o.header_);
    by_name_ = std::move(o.by_name_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  base_ = nullptr;
  size_ = 0;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

const void* SafetensorsFile::data(const TensorInfo& t) const {
  // An info from another file would index past our mapping; catch that mistake here.
  const auto& ts = header_.tensors;
  const bool ours = !ts.empty() && std::less_equal<>()(ts.data(), &t) &&
                    std::less<>()(&t, ts.data() + ts.size());
  ST_CHECK(ours, path_, ": tensor '", t.name, "' does not belong to this file");
  return base_ + header_.data_start + t.begin;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const TensorInfo* t = find(name);
  ST_CHECK(t, path_, ": no tensor '", name, "'");
  return to_f32(data(*t), t->dtype, t->numel(), path_ + ": tensor '" + name + "'");
}

// ---- SafetensorsSet ---------------------------------------------------------------

std::map<std::string, std::string> parse_safetensors_index(const std::string& text,
                                                           const std::string& who) {
  const json j = parse_json_strict(text.data(), text.data() + text.size(), who, "index");
  ST_CHECK(j.is_object(), who, ": index is not a JSON object");
  ST_CHECK(j.contains("weight_map"), who, ": index has no 'weight_map'");
  const json& wm = j["weight_map"];
  ST_CHECK(wm.is_object(), who, ": 'weight_map' is not a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& [tensor, file] : wm.items()) {
    ST_CHECK(file.is_string(), who, ": weight_map entry for tensor '", tensor,
             "' is not a string");
    check_shard_name(who, tensor, file.get_ref<const std::string&>());
    out.emplace(tensor, file.get<std::string>());
  }
  return out;
}

SafetensorsSet SafetensorsSet::open(const std::string& path) {
  return classify_errors(ErrorKind::Data, [&] { return open_unclassified(path); });
}

SafetensorsSet SafetensorsSet::open_unclassified(const std::string& path) {
  SafetensorsSet s;
  s.source_ = path;
  std::error_code ec;
  fs::path index;
  fs::path single = path;
  if (fs::is_directory(path, ec)) {
    const fs::path i = fs::path(path) / kIndexName, m = fs::path(path) / kSingleName;
    const bool has_i = fs::exists(i, ec), has_m = fs::exists(m, ec);
    // Both present means one is stale; guessing which could load the wrong weights.
    ST_CHECK(!(has_i && has_m), path, ": holds both ", kIndexName, " and ", kSingleName,
             "; remove the stale one");
    ST_CHECK(has_i || has_m, path, ": no ", kIndexName, " or ", kSingleName, " in directory");
    if (has_i) index = i;
    else single = m;
  } else if (fs::path(path).extension() == ".json") {
    index = path;
  }

  if (index.empty()) {
    s.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(single.string())));
    for (const auto& t : s.files_[0]->tensors()) s.by_name_.emplace(t.name, Where{0, &t});
    return s;
  }

  const std::string who = index.string();
  std::ifstream in(index, std::ios::binary);
  ST_CHECK(in, who, ": cannot open: ", std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  ST_CHECK(!in.bad(), who, ": read failed");
  const auto weight_map = parse_safetensors_index(text.str(), who);
  ST_CHECK(!weight_map.empty(), who, ": weight_map is empty");

  // Open each shard once, in sorted name order (shard numbering), remembering which
  // tensor first named it so that errors can say why we were opening it.
  std::map<std::string, std::string> shards;  // file -> a tensor naming it
  for (const auto& [tensor, file] : weight_map) shards.emplace(file, tensor);
  std::map<std::string, size_t> file_index;
  for (const auto& [file, tensor] : shards) {
    try {
      s.files_.push_back(std::make_unique<SafetensorsFile>(
          SafetensorsFile::open((index.parent_path() / file).string())));
    } catch (const Error& e) {
      fail_as(e.kind(), who, ": shard file '", file, "' (named for tensor '", tensor, "'): ", e.what());
    }
    file_index.emplace(file, s.files_.size() - 1);
  }
  for (const auto& [tensor, file] : weight_map)
    ST_CHECK(s.files_[file_index.at(file)]->find(tensor), who, ": tensor '", tensor,
             "' is mapped to shard file '", file, "', which does not contain it");

  // Tensors a shard holds beyond the index are kept, but a name in two shards is
  // ambiguous, whatever the index says.
  for (size_t f = 0; f < s.files_.size(); ++f) {
    for (const auto& t : s.files_[f]->tensors()) {
      auto [it, fresh] = s.by_name_.emplace(t.name, Where{f, &t});
      ST_CHECK(fresh, who, ": tensor '", t.name, "' appears in both shard files '",
               s.files_[it->second.file]->path(), "' and '", s.files_[f]->path(), "'");
    }
  }
  return s;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, _] : by_name_) out.push_back(name);
  return out;
}

const TensorInfo* SafetensorsSet::find(const std::string& name,
                                       const SafetensorsFile** file) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  if (file) *file = files_[it->second.file].get();
  return it->second.info;
}

const void* SafetensorsSet::data(const std::string& name) const {
  const SafetensorsFile* f = nullptr;
  const TensorInfo* t = find(name, &f);
  ST_CHECK(t, source_, ": no tensor '", name, "'");
  return f->data(*t);
}

std::vector<float> SafetensorsSet::read_f32(const std::string& name) const {
  const SafetensorsFile* f = nullptr;
  const TensorInfo* t = find(name, &f);
  ST_CHECK(t, source_, ": no tensor '", name, "'");
  return f->read_f32(name);
}

// ---- writing ----------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::vector<uint64_t> sizes = validate_for_write(path, tensors);

  // json objects are std::maps, so the keys come out sorted whatever the order here.
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    h[t.name] = json{{"dtype", safetensors_dtype_name(t.dtype)},
                     {"shape", t.shape},
                     {"data_offsets", json::array({off, off + sizes[i]})}};
    off += sizes[i];
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const json::exception& e) {
    fail(path, ": tensor names and metadata must be valid UTF-8: ", e.what());
  }
  // Padding to 8 keeps the data area 8-byte aligned in the file, as the reference does.
  text.append((8 - text.size() % 8) % 8, ' ');
  ST_CHECK(text.size() <= kMaxHeaderBytes, path, ": header of ", text.size(),
           " bytes exceeds the limit of ", kMaxHeaderBytes, " bytes");

  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  AtomicFile f(path);
  f.write(len, 8);
  f.write(text.data(), text.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    if (sizes[i]) f.write(tensors[i].data, sizes[i]);
  f.commit();
}

void write_safetensors_index(const std::string& dir,
                             const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size) {
  const std::string path = (fs::path(dir) / kIndexName).string();
  for (const auto& [tensor, file] : weight_map) check_shard_name(path, tensor, file);
  const json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  std::string text;
  try {
    text = j.dump(2) + "\n";
  } catch (const json::exception& e) {
    fail(path, ": tensor names must be valid UTF-8: ", e.what());
  }
  write_text_atomic(path, text);
}

std::vector<std::string> write_safetensors_sharded(
    const std::string& dir, const std::vector<TensorToWrite>& tensors, uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata) {
  ST_CHECK(max_shard_bytes > 0, dir, ": max shard size must be positive");
  const std::vector<uint64_t> sizes = validate_for_write(dir, tensors);

  // Greedy in the given order: start a new shard when the next tensor would not fit.
  std::vector<std::vector<TensorToWrite>> shards(1);
  uint64_t used = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!shards.back().empty() && used + sizes[i] > max_shard_bytes) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(tensors[i]);
    used += sizes[i];
    total += sizes[i];
  }

  // The reader refuses a directory with both layouts, so the other one is removed
  // once the new checkpoint is complete.
  const fs::path d(dir);
  std::error_code ec;
  if (shards.size() == 1) {
    write_safetensors((d / kSingleName).string(), shards[0], metadata);
    fs::remove(d / kIndexName, ec);
    return {kSingleName};
  }
  std::vector<std::string> names;
  std::map<std::string, std::string> weight_map;
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    write_safetensors((d / name).string(), shards[s], metadata);
    for (const auto& t : shards[s]) weight_map.emplace(t.name, name);
    names.push_back(name);
  }
  write_safetensors_index(dir, weight_map, total);
  fs::remove(d / kSingleName, ec);
  return names;
}

}  // namespace st
