#include "train/stop_signal.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace st {
namespace {

// SIGTERM (what Kubernetes and a spot interruption send) or SIGINT: the first asks
// the run to stop at the next step boundary; a second one stops it at once.
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_stop_at_s = 0;  // CLOCK_MONOTONIC seconds of the first signal

void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  g_stop_at_s = static_cast<std::sig_atomic_t>(ts.tv_sec);
  g_stop_signal = sig;
}

}  // namespace

double monotonic_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

StopSignals::StopSignals() {
  g_stop_signal = 0;
  term_ = std::signal(SIGTERM, on_stop_signal);
  intr_ = std::signal(SIGINT, on_stop_signal);
}

StopSignals::~StopSignals() {
  std::signal(SIGTERM, term_);
  std::signal(SIGINT, intr_);
}

StopRequest StopSignals::agree(Comm& world) const {
  StopRequest r;
  const bool stop = world.all_reduce_sum(g_stop_signal != 0 ? 1.0 : 0.0) > 0;
  if (!stop) return r;
  r.signal = g_stop_signal != 0 ? static_cast<int>(g_stop_signal) : SIGTERM;
  // Counted from this rank's signal (or from now, where another rank got it).
  r.since_s = g_stop_signal != 0 ? static_cast<double>(g_stop_at_s) : monotonic_s();
  return r;
}

GraceWatchdog::GraceWatchdog(double deadline_s, int sig, std::function<void()> on_expiry)
    : thread_([this, deadline_s, sig, on_expiry = std::move(on_expiry)] {
        std::unique_lock<std::mutex> lock(mu_);
        while (!done_) {
          const double left = deadline_s - monotonic_s();
          if (left <= 0) {
            on_expiry();
            std::fflush(nullptr);
            std::_Exit(128 + sig);
          }
          cv_.wait_for(lock, std::chrono::duration<double>(left));
        }
      }) {}

GraceWatchdog::~GraceWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace st
