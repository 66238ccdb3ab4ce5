// metrics.jsonl: one JSON object per line (per step, per evaluation), appended and flushed as
// written so a crashed run keeps what it measured; and the progress line a person reads.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/duration.h"  // format_duration, now_seconds: the metrics' durations

namespace frugal {

// Appends records to metrics.jsonl; it never rewrites a line it wrote.
class MetricsWriter {
 public:
  // append = true continues an existing file (resume); false starts a new, empty one. An Error
  // naming the file when it cannot be opened or is not a regular file.
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends `record` as one line. A write the system refuses (a full disk) leaves no part of
  // the line in the file (it is cut back to its previous end, so it still ends in a whole
  // record) and is an Error naming the file, the reason and the record's step.
  void write(const nlohmann::json& record);
  // The records written so far on disk (fdatasync): before a checkpoint of their step can be
  // committed, so that a committed step's record survives whatever stops the run. An Error
  // naming the file when the system refuses.
  void sync();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  off_t size_ = 0;  // where the last whole record ends
};

// A resumed run (or a rollback) drops the records after `step` (a crash after the checkpoint
// left some), so every step appears once. Lines that are not whole JSON records (one cut by a
// crash) go too; a missing file is left missing. The records dropped are, in any file frugal
// wrote, the file's tail: the file is cut there (ftruncate, which needs no free space) and
// nothing before it is touched. Otherwise (a cut line between records) the kept lines are
// written to a new file that replaces the old one only once complete. An Error naming the file
// when the system refuses; the file is then as it was.
void truncate_metrics(const std::string& path, int64_t step);

// The most host memory this process has had resident since it started (the kernel's count:
// pinned buffers, the heap, the libraries), in bytes.
size_t peak_resident_bytes();

// The host memory the kernel says is available to new allocations (MemAvailable), in bytes;
// 0 when it cannot tell.
size_t available_host_bytes();

}  // namespace frugal
