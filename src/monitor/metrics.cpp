// metrics.jsonl writer and time helpers.
#include "monitor/metrics.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/regular_file.h"

namespace frugal {

void truncate_metrics(const std::string& path, int64_t step) {
  if (non_regular_kind(path) != "missing") require_regular_file(path, "metrics file");
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_object() && record.value("step", int64_t(0)) <= step) kept += line + "\n";
  }
  in.close();
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << kept;
  std::filesystem::rename(tmp, path);
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_) fail("cannot open metrics file '", path, "' for writing");
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    fail("cannot write to metrics file '", path_, "'");
}

size_t peak_resident_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return size_t(usage.ru_maxrss) * 1024;  // Linux counts kibibytes
}

size_t available_host_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (meminfo >> key) {
    if (key == "MemAvailable:" && meminfo >> kib) return kib * 1024;
    meminfo.ignore(256, '\n');
  }
  return 0;
}

}  // namespace frugal
