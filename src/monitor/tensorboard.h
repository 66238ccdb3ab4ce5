// TensorBoard event files beside metrics.jsonl (monitor.tensorboard): every number of a metrics
// record as a scalar summary, in the TFRecord framing `tensorboard --logdir` and its readers take.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace frugal {

// One file of events, written by rank 0 as the run goes (each record flushed, like
// metrics.jsonl, so that a crash keeps what was measured and TensorBoard shows it live).
//
// How a resumed or rolled-back run keeps every step once: a new writer opens a new file
// whose first events are the file version ("brain.Event:2") and a session start at
// `first_step`. TensorBoard reads a run's files in name order; its event accumulator treats a
// session start after the first as a restart and drops every value it holds at that step or
// later (the steps an interrupted run wrote after its checkpoint), and its Rust data server
// replaces a tag's values from a step that comes again. The name's time is raised past the
// newest event file already in the directory, so that the new file is read last.
class TensorBoardWriter {
 public:
  using Clock = std::function<double()>;  // seconds since the Unix epoch

  // A new event file in `dir` (created when missing), events.out.tfevents.<seconds>.<host>.
  // <pid>.frugal, starting at `first_step`: 0 for a fresh run (which replaces whatever an
  // earlier run left in `dir`), the checkpoint's step + 1 for a resumed one. The clock gives
  // each event's wall_time (the system clock unless a test gives its own). Throws Error
  // naming the file when it cannot be written.
  TensorBoardWriter(const std::string& dir, int64_t first_step, Clock clock = nullptr);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at the record's "step" with a scalar for every number in it (record_scalars);
  // a record without numbers writes nothing.
  void write(const nlohmann::json& record);
  // A rollback: steps from `step` on are trained again, so what this run wrote for them goes
  // (a session start at `step`, as a resumed run's).
  void restart_at(int64_t step);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
  Clock clock_;
};

// The scalars of a metrics record: every number at any depth, under its path joined by '/'
// ("loss", "seconds/forward_backward", "health/units/layers.0/grad_norm"; an array's items by
// index), in the record's order. "step" itself is the events' step, not a scalar; nulls,
// booleans and text are left out.
std::vector<std::pair<std::string, double>> record_scalars(const nlohmann::json& record);

// The wire format, for the writer and its tests. Each returns one encoded Event proto
// (tensorboard's event.proto): wall_time (field 1, double), step (2, int64), and one of
// file_version (3), summary (5: values of tag (1) and simple_value (2, float)) or session_log
// (7: status (1), START = 1).
std::string file_version_event(double wall_time, std::string_view version = "brain.Event:2");
std::string session_start_event(double wall_time, int64_t step);
std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars);

// A TFRecord: the data's length (uint64, little-endian), the masked CRC32C of those 8 bytes,
// the data, the masked CRC32C of the data.
std::string tfrecord(std::string_view data);
// TFRecord's masked CRC32C: the CRC rotated right by 15 bits plus 0xa282ead8.
uint32_t masked_crc32c(std::string_view bytes);

}  // namespace frugal
