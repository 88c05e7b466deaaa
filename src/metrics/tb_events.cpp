#include "metrics/tb_events.h"

#include <isa-l/crc.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "metrics/metrics.h"
#include "metrics/tb_event.pb.h"

namespace st {
namespace fs = std::filesystem;

namespace {

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string h = buf.data();
  for (char& c : h)
    if (c == '/') c = '_';
  return h;
}

}  // namespace

const std::vector<std::string>& step_scalar_tags() {
  static const std::vector<std::string> tags = {
      "train/loss",         "train/lr",   "train/grad_norm", "perf/tokens_per_s",         "perf/step_s",
      "perf/tflops_per_rank", "perf/mfu", "memory/peak_allocated_gib", "comm/bytes_sent", "comm/inter_node_bytes",
      "comm/blocked_s"};
  return tags;
}

std::vector<TbScalar> step_scalars(const StepMetrics& m) {
  const double values[] = {m.loss,   m.lr,  m.grad_norm, m.tokens_per_s,
                           m.step_s, m.tflops, m.mfu,    static_cast<double>(m.peak_memory_bytes) / (1ull << 30),
                           static_cast<double>(m.comm_bytes()), static_cast<double>(m.comm_inter_node_bytes),
                           m.comm_blocked_s};
  const auto& tags = step_scalar_tags();
  std::vector<TbScalar> out;
  out.reserve(tags.size());
  for (size_t i = 0; i < tags.size(); ++i) out.push_back({tags[i], values[i]});
  return out;
}

uint32_t tfrecord_masked_crc(const void* data, size_t n) {
  ST_CHECK(n <= static_cast<size_t>(INT_MAX), "TensorBoard record of ", n, " bytes is too large");
  // ISA-L's crc32_iscsi neither inverts its seed nor its result: CRC32C is ~f(~0).
  const uint32_t crc =
      ~crc32_iscsi(static_cast<unsigned char*>(const_cast<void*>(data)), static_cast<int>(n), 0xFFFFFFFFu);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TbEventWriter::TbEventWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  ST_CHECK(!ec && fs::is_directory(dir), "TensorBoard directory '", dir, "': cannot create it: ",
           ec ? ec.message() : "not a directory");
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%010lld", static_cast<long long>(wall_time_now()));
  const std::string base = (fs::path(dir) / ("events.out.tfevents." + std::string(stamp) + "." + host_name())).string();
  // "x" (exclusive) so that a name another run took in the same second is never
  // reused: the next suffix is tried instead.
  for (int n = 0; n < 1000 && !file_; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    file_ = std::fopen(path_.c_str(), "wbx");
    if (!file_ && errno != EEXIST) fail("cannot create TensorBoard events file '", path_, "': ", std::strerror(errno));
  }
  ST_CHECK(file_, "cannot create TensorBoard events file '", base, "': the name and 999 suffixes are taken");
  tb::Event e;
  e.set_wall_time(wall_time_now());
  e.set_file_version("brain.Event:2");
  write_record(e.SerializeAsString());
}

TbEventWriter::~TbEventWriter() {
  if (file_) std::fclose(file_);
}

void TbEventWriter::write_start(int64_t step) {
  tb::Event e;
  e.set_wall_time(wall_time_now());
  e.set_step(step);
  e.mutable_session_log()->set_status(tb::SessionLog::START);
  write_record(e.SerializeAsString());
}

void TbEventWriter::write_scalars(int64_t step, const std::vector<TbScalar>& scalars) {
  tb::Event e;
  e.set_wall_time(wall_time_now());
  e.set_step(step);
  tb::Summary* s = e.mutable_summary();
  for (const TbScalar& x : scalars) {
    tb::Summary::Value* v = s->add_value();
    v->set_tag(x.tag);
    v->set_simple_value(static_cast<float>(x.value));
  }
  write_record(e.SerializeAsString());
}

void TbEventWriter::write_record(const std::string& data) {
  ST_CHECK(file_, "TensorBoard events file '", path_, "' is closed after an earlier error");
  std::string rec;
  rec.reserve(data.size() + 16);
  const uint64_t len = data.size();
  for (int i = 0; i < 8; ++i) rec.push_back(static_cast<char>((len >> (8 * i)) & 0xff));  // little-endian
  auto put_u32 = [&](uint32_t x) {
    for (int i = 0; i < 4; ++i) rec.push_back(static_cast<char>((x >> (8 * i)) & 0xff));
  };
  put_u32(tfrecord_masked_crc(rec.data(), 8));
  rec += data;
  put_u32(tfrecord_masked_crc(data.data(), data.size()));

  const long before = std::ftell(file_);
  if (std::fwrite(rec.data(), 1, rec.size(), file_) == rec.size() && std::fflush(file_) == 0) return;
  // A full disk: cut the partial record off, so every record in the file is whole.
  const int err = errno ? errno : EIO;
  std::fclose(file_);
  file_ = nullptr;
  std::error_code ec;
  if (before >= 0) fs::resize_file(path_, static_cast<uintmax_t>(before), ec);
  fail("writing TensorBoard events file '", path_, "' failed: ", std::strerror(err));
}

void remove_tb_event_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  std::vector<fs::path> old;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().filename().string().find("tfevents") != std::string::npos)
      old.push_back(e.path());
  for (const fs::path& p : old) {
    fs::remove(p, ec);
    ST_CHECK(!ec, "cannot remove the old TensorBoard events file '", p.string(), "': ", ec.message());
  }
}

}  // namespace st
