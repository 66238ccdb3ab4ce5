// stat() before anything is opened, then open(O_NONBLOCK) and fstat() on the descriptor.
#include "core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/error.h"

namespace frugal {

namespace {

const char* kMissing = "missing";
const char* kNotAccessible = "not accessible: ";

// What a stat's mode says a file is, "" for a regular file.
std::string kind_of_mode(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a file of any known kind";
}

// The kind for a failed stat() or open() of `path` with `err`.
std::string kind_of_errno(const std::string& path, int err) {
  if (err == ELOOP) return "a symlink loop";
  if (err == ENOENT) {
    struct stat link {};
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      return "a symlink to a missing file";
    return kMissing;
  }
  return kNotAccessible + std::string(std::strerror(err));
}

[[noreturn]] void fail_kind(const std::string& path, const std::string& what,
                            const std::string& kind) {
  if (kind == kMissing) fail(what, " '", path, "' does not exist");
  if (kind.rfind(kNotAccessible, 0) == 0)
    fail(what, " '", path, "' cannot be read: ", kind.substr(std::strlen(kNotAccessible)));
  fail(what, " '", path, "' is ", kind, ", not a regular file");
}

}  // namespace

std::string non_regular_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return kind_of_errno(path, errno);
  return kind_of_mode(st.st_mode);
}

void require_regular_file(const std::string& path, const std::string& what) {
  const std::string kind = non_regular_kind(path);
  if (!kind.empty()) fail_kind(path, what, kind);
}

RegularFile::RegularFile(const std::string& path, const std::string& what)
    : path_(path), what_(what) {
  require_regular_file(path, what);
  do {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) fail_kind(path, what, kind_of_errno(path, errno));
  struct stat st {};
  const std::string kind = ::fstat(fd_, &st) != 0
                               ? kNotAccessible + std::string(std::strerror(errno))
                               : kind_of_mode(st.st_mode);
  if (!kind.empty()) {
    ::close(fd_);
    fail_kind(path, what, kind);
  }
  size_bytes_ = int64_t(st.st_size);
  // Reads of a regular file do not heed O_NONBLOCK, but whoever takes the descriptor may
  // hand it on: it is an ordinary blocking one from here.
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string RegularFile::read_prefix(size_t max_bytes) const {
  std::string bytes;
  bytes.reserve(std::min(max_bytes, size_t(size_bytes_)));
  char buffer[65536];
  while (bytes.size() < max_bytes) {
    const size_t want = std::min(sizeof buffer, max_bytes - bytes.size());
    const ssize_t n = ::pread(fd_, buffer, want, off_t(bytes.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(what_, " '", path_, "' cannot be read: ", std::strerror(errno));
    if (n == 0) break;
    bytes.append(buffer, size_t(n));
  }
  return bytes;
}

std::string RegularFile::read_all(size_t max_bytes) const {
  // One byte past the limit tells a file at the limit from a larger one (it may have grown).
  std::string bytes = read_prefix(max_bytes == SIZE_MAX ? max_bytes : max_bytes + 1);
  if (bytes.size() > max_bytes)
    fail(what_, " '", path_, "' is larger than ", max_bytes, " bytes, more than such a file holds");
  return bytes;
}

std::string read_regular_file(const std::string& path, const std::string& what, size_t max_bytes) {
  return RegularFile(path, what).read_all(max_bytes);
}

}  // namespace frugal
