// TensorBoard event files. TensorBoard reads a directory of
// `events.out.tfevents.<time>.<host>` files, each a sequence of TFRecords:
//
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes |
//   length bytes of data          | uint32 masked CRC32C of the data
//
// (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8), the data a serialized
// tensorflow.Event (src/metrics/tb_event.proto). The first record of a file is an
// Event whose file_version is "brain.Event:2"; shardtrain then writes a SessionLog
// START at the first step the run will write, and one Event per step holding that
// step's scalars as Summary values (simple_value). Each record is flushed as it is
// written, so TensorBoard shows a run while it trains.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace st {

struct StepMetrics;

struct TbScalar {
  std::string tag;
  double value = 0;  // stored as a float (simple_value)
};

// The scalars of one training step, in this order: train/loss, train/lr,
// train/grad_norm, perf/tokens_per_s, perf/step_s, perf/tflops_per_rank, perf/mfu,
// memory/peak_allocated_gib (docs/operations.md says what each holds).
std::vector<TbScalar> step_scalars(const StepMetrics& m);
const std::vector<std::string>& step_scalar_tags();

// The masked CRC32C of TFRecord framing (the CRC from Intel's ISA-L).
uint32_t tfrecord_masked_crc(const void* data, size_t n);

class TbEventWriter {
 public:
  // Creates `dir` when missing and starts a new events file in it,
  // events.out.tfevents.<unix seconds, 10 digits>.<host name>, with ".1", ".2", ...
  // appended when that name is taken (two runs within one second), so the names
  // sort in the order the files were started, which is the order TensorBoard reads
  // them in. Writes the file_version record. Errors name the directory or file.
  explicit TbEventWriter(const std::string& dir);
  ~TbEventWriter();
  TbEventWriter(const TbEventWriter&) = delete;
  TbEventWriter& operator=(const TbEventWriter&) = delete;

  const std::string& path() const { return path_; }

  // A SessionLog START at `step`: TensorBoard drops every value that earlier files
  // of the directory hold at steps >= `step`, so the steps of a resumed run replace
  // those its predecessor wrote after the checkpoint.
  void write_start(int64_t step);
  // One Event at `step` with every scalar as a Summary value.
  void write_scalars(int64_t step, const std::vector<TbScalar>& scalars);

 private:
  // One TFRecord around `data`, written and flushed; on failure (a full disk) the
  // partial record is cut off and the error names the file.
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

// Removes the events files (names containing "tfevents") from `dir`, if it exists:
// a run that starts afresh in a run directory replaces its metrics, TensorBoard's
// included. Other files are left alone.
void remove_tb_event_files(const std::string& dir);

}  // namespace st
