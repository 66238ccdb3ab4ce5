// Replacing a file whole: temporary file, fsync, rename.
#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace frugal {

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) {  // not a refusal, yet no progress: call it what it is on a disk
      errno = ENOSPC;
      return false;
    }
    data += n;
    size -= size_t(n);
  }
  return true;
}

void replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());  // a temporary file a killed process left
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    fail("cannot create '", tmp, "': ", std::strerror(errno), "; '", path, "' is unchanged");
  // fsync and close report what the disk refused late (NFS reports a full disk there).
  bool ok = write_all(fd, text.data(), text.size()) && ::fsync(fd) == 0;
  int error = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    error = errno;
  }
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    error = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    fail("cannot write '", path, "': ", std::strerror(error), "; it is unchanged");
  }
  // The rename survives a crash once the directory is on disk; the new content is in place
  // either way, so a failure here is not one to report.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace frugal
