// Plain logging to stderr/stdout with an optional rank prefix, and small
// formatting helpers shared by the CLI and the trainer.
#pragma once
#include <cstdint>
#include <string>

namespace st {

// "[rank 3] " prefix once there is more than one rank; empty otherwise.
void set_log_rank(int rank, int world);
void log_info(const std::string& msg);   // stdout
void log_warn(const std::string& msg);   // stderr, "warning: " prefix

std::string human_bytes(double bytes);   // "1.50 GiB"
std::string human_count(double n);       // "1.54B", "12.3M", "512"
double now_seconds();                    // monotonic clock
// Seconds since this process started (the kernel's start time, so the dynamic
// loader and static initialisers count too); negative when it cannot be read.
double seconds_since_process_start();

}  // namespace st
