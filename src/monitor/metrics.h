// metrics.jsonl: one JSON object per line (per step, per evaluation), flushed as written so
// a crashed run keeps what it measured; and the progress line a person reads.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "core/duration.h"  // format_duration, now_seconds: the metrics' durations

namespace frugal {

class MetricsWriter {
 public:
  // append = true continues an existing file (resume); false starts a new one.
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// A resumed run rewrites metrics.jsonl without the records after `step` (a crash after the
// checkpoint left some), so every step appears once. Lines that are not JSON (a record cut by
// the crash) go too; a missing file is left missing.
void truncate_metrics(const std::string& path, int64_t step);

// The most host memory this process has had resident since it started (the kernel's count:
// pinned buffers, the heap, the libraries), in bytes.
size_t peak_resident_bytes();

// The host memory the kernel says is available to new allocations (MemAvailable), in bytes;
// 0 when it cannot tell.
size_t available_host_bytes();

}  // namespace frugal
