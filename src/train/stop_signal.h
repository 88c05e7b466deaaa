// Stopping a run on SIGTERM (what Kubernetes and a spot interruption send) or
// SIGINT: the first signal asks the run to stop at the next step boundary, where
// every rank agrees on it (StopSignals::agree) and saves a checkpoint; a second one
// stops the process at once. GraceWatchdog bounds the time the save may take.
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/comm.h"

namespace st {

// What the ranks agreed at a step boundary: stop (signal != 0) or go on.
struct StopRequest {
  int signal = 0;      // this rank's signal, or SIGTERM where only another rank got one
  double since_s = 0;  // CLOCK_MONOTONIC seconds of this rank's signal (or of the agreement)
  bool requested() const { return signal != 0; }
};

// Installs the handlers for its lifetime (one at a time; a signal received before
// it is forgotten) and restores the previous ones.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Collective over `world`: whether any rank was told to stop.
  StopRequest agree(Comm& world) const;

 private:
  using Handler = void (*)(int);
  Handler term_, intr_;
};

// CLOCK_MONOTONIC, in seconds (the clock of StopRequest::since_s).
double monotonic_s();

// run.term_grace_s: once the ranks stop for a signal, the save must be complete
// within the grace period counted from the signal (Kubernetes kills the pod at its
// terminationGracePeriodSeconds). Past it this exits the process with 128 + the
// signal, after `on_expiry` (the summary); the unfinished step-N.tmp is never chosen
// by resume=auto, so the last complete checkpoint stays the one to resume from.
class GraceWatchdog {
 public:
  GraceWatchdog(double deadline_s, int sig, std::function<void()> on_expiry);
  ~GraceWatchdog();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace st
