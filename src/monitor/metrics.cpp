// metrics.jsonl writer and time helpers.
#include "monitor/metrics.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string_view>

#include "core/atomic_file.h"
#include "core/error.h"

namespace frugal {

namespace {

// Opens metrics.jsonl with `flags`; -1 (errno ENOENT) when it does not exist and `flags` do not
// create it. Anything but a regular file is refused by name: a FIFO would block the open and
// every write, a directory fail them with a less clear reason.
int open_metrics(const std::string& path, int flags) {
  struct stat st = {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail("metrics file '", path, "' is not a regular file");
  // O_NONBLOCK: should it become a FIFO after the stat, the open does not wait for a reader.
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    if (errno == ENOENT && !(flags & O_CREAT)) return -1;
    fail("cannot open metrics file '", path, "': ", std::strerror(errno));
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("metrics file '", path, "' is not a regular file");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_whole(int fd, const std::string& path) {
  std::string content;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      fail("cannot read metrics file '", path, "': ", std::strerror(error));
    }
    if (n == 0) return content;
    content.append(buffer, size_t(n));
  }
}

// A record a resume to `step` keeps: a JSON object whose step (0 when it has none) is at most
// `step`.
bool kept_record(std::string_view line, int64_t step) {
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
  if (!record.is_object()) return false;
  const auto it = record.find("step");
  if (it == record.end()) return true;
  return it->is_number_integer() && it->get<int64_t>() <= step;
}

}  // namespace

void truncate_metrics(const std::string& path, int64_t step) {
  const int fd = open_metrics(path, O_RDWR);
  if (fd < 0) return;
  const std::string content = read_whole(fd, path);
  std::string kept;
  size_t first_dropped = std::string::npos;  // where the first dropped line starts
  bool kept_after_dropped = false;
  for (size_t pos = 0; pos < content.size();) {
    const size_t end = content.find('\n', pos);
    // A last line without its newline is a record cut short: the writer ends every one with it.
    const bool keep = end != std::string::npos &&
                      kept_record(std::string_view(content).substr(pos, end - pos), step);
    if (keep) {
      kept.append(content, pos, end + 1 - pos);
      kept_after_dropped = kept_after_dropped || first_dropped != std::string::npos;
    } else if (first_dropped == std::string::npos) {
      first_dropped = pos;
    }
    pos = end == std::string::npos ? content.size() : end + 1;
  }
  if (first_dropped == std::string::npos) {  // nothing to drop
    ::close(fd);
    return;
  }
  if (!kept_after_dropped) {
    // The dropped records are the tail: cut it off; the records before it stay as they are.
    const bool ok = ::ftruncate(fd, off_t(first_dropped)) == 0 && ::fdatasync(fd) == 0;
    const int error = errno;
    ::close(fd);
    if (!ok)
      fail("cannot drop the records after step ", step, " from metrics file '", path,
           "': ", std::strerror(error));
    return;
  }
  ::close(fd);
  replace_file(path, kept);
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  fd_ = open_metrics(path, O_WRONLY | O_CREAT | O_APPEND | (append ? 0 : O_TRUNC));
  struct stat st = {};
  if (::fstat(fd_, &st) != 0) {
    const int error = errno;
    ::close(fd_);
    fail("cannot open metrics file '", path, "': ", std::strerror(error));
  }
  size_ = st.st_size;
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  if (write_all(fd_, line.data(), line.size())) {
    size_ += off_t(line.size());
    return;
  }
  const int error = errno;
  // Whatever part of the line reached the file goes again: the file ends in a whole record.
  const bool cut = ::ftruncate(fd_, size_) == 0;
  const std::string step = record.contains("step") ? record["step"].dump() : "?";
  fail("cannot write to metrics file '", path_, "': ", std::strerror(error),
       "; the record of step ", step, " is not in it",
       cut ? "" : " (a part of it may be, which a resume removes)");
}

void MetricsWriter::sync() {
  if (::fdatasync(fd_) != 0)
    fail("cannot write metrics file '", path_, "' to disk: ", std::strerror(errno));
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
