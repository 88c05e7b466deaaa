#include "metrics/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"

namespace st {

namespace {
// human_duration, with tenths of a second under a minute (the elapsed time).
std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0 || std::llround(s) >= 60) return human_duration(s);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}
}  // namespace

std::string format_step_line(const StepMetrics& m) {
  char buf[256];
  const int width = static_cast<int>(std::to_string(m.total_steps).size());
  std::snprintf(buf, sizeof buf, "step %*d/%d | loss %.4f | lr %.3e | grad_norm %.4f | %s tok/s", width, m.step,
                m.total_steps, m.loss, m.lr, m.grad_norm, human_count(m.tokens_per_s).c_str());
  std::string line = buf;
  if (m.mfu > 0) {
    std::snprintf(buf, sizeof buf, " | %.3g TFLOP/s | MFU %.1f%%", m.tflops, 100 * m.mfu);
    line += buf;
  }
  line += " | elapsed " + format_duration(m.elapsed_s);
  if (m.eta_s >= 0) line += " | eta " + human_duration(m.eta_s);
  return line;
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[48];
  const long long t = std::llround(s);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, t / 60 % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%llds", t);
  return buf;
}

double EtaEstimator::update(int step, int total_steps, double step_s) {
  if (first_s_ < 0) {
    first_s_ = step_s;
  } else {
    recent_.push_back(step_s);
    if (recent_.size() > window_) recent_.pop_front();
  }
  double mean = first_s_;
  if (!recent_.empty()) {
    double sum = 0;
    for (double x : recent_) sum += x;
    mean = sum / static_cast<double>(recent_.size());
  }
  return std::max(0, total_steps - step) * mean;
}

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  ST_CHECK(out_, "cannot open metrics file '", path, "' for writing");
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  const std::streampos before = out_.tellp();
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) {
    // A full disk: cut the partial line off, so the file stays whole lines.
    const int err = errno;
    out_.close();
    std::error_code ec;
    if (before >= 0) std::filesystem::resize_file(path_, static_cast<uintmax_t>(before), ec);
    fail("writing metrics file '", path_, "' failed: ", std::strerror(err ? err : EIO));
  }
}

void MetricsLog::write_step(const StepMetrics& m) {
  write({{"step", m.step},
         {"loss", m.loss},
         {"lr", m.lr},
         {"grad_norm", m.grad_norm},
         {"tokens_per_s", m.tokens_per_s},
         {"elapsed_s", m.elapsed_s},
         {"tokens", m.tokens},
         {"tflops_per_rank", m.tflops},
         {"mfu", m.mfu},
         {"step_s", m.step_s},
         {"peak_memory_bytes", m.peak_memory_bytes},
         {"comm_all_gather_bytes", m.comm_all_gather_bytes},
         {"comm_reduce_scatter_bytes", m.comm_reduce_scatter_bytes},
         {"comm_all_reduce_bytes", m.comm_all_reduce_bytes},
         {"comm_broadcast_bytes", m.comm_broadcast_bytes},
         {"comm_intra_node_bytes", m.comm_bytes() - m.comm_inter_node_bytes},
         {"comm_inter_node_bytes", m.comm_inter_node_bytes},
         {"comm_blocked_s", m.comm_blocked_s}});
}

ProgressBar::ProgressBar(const std::string& mode) {
  enabled_ = mode == "on" || (mode == "auto" && isatty(STDOUT_FILENO));
}

void ProgressBar::update(const StepMetrics& m) {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const double frac = m.total_steps > 0 ? static_cast<double>(m.step) / m.total_steps : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::printf("\r\033[K[%s] %d/%d %3d%% loss %.4f %s tok/s eta %s", bar.c_str(), m.step, m.total_steps,
              static_cast<int>(100 * frac), m.loss, human_count(m.tokens_per_s).c_str(),
              human_duration(m.eta_s).c_str());
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!drawn_) return;
  std::printf("\r\033[K");
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace st
