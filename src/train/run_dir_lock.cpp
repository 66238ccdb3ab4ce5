// The lock on train.out_dir: a POSIX record lock on out_dir/train.lock, and the holder's
// details in the file for the message of a run that finds it taken.
#include "train/run_dir_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc = {};
  ::gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string read_lock_file(int fd) {
  std::string content;
  char buffer[512];
  for (off_t at = 0; content.size() < 4096;) {
    const ssize_t n = ::pread(fd, buffer, sizeof buffer, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    content.append(buffer, size_t(n));
    at += n;
  }
  return content;
}

// "pid 1234 on host node7, started 2026-12-01T10:00:00Z" from a lock file's content; "" when it
// holds nothing (a run that ended cleanly, or one that has just taken the lock).
std::string describe_holder(const std::string& content) {
  if (content.empty()) return "";
  const nlohmann::json j = nlohmann::json::parse(content, nullptr, false);
  try {
    if (j.is_object() && j.contains("pid") && j.contains("host"))
      return "pid " + j["pid"].dump() + " on host " + j["host"].get<std::string>() + ", started " +
             j.value("started", std::string("at an unknown time"));
  } catch (const nlohmann::json::exception&) {
  }
  return "details unreadable: '" + printable(content) + "'";
}

}  // namespace

RunDirLock::RunDirLock(const std::string& dir) : path_((fs::path(dir) / kFileName).string()) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("config key 'train.out_dir': cannot create '", dir, "': ", ec.message());
  struct stat st = {};
  if (::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail("config key 'train.out_dir': the lock file '", path_, "' is not a regular file");
  // O_NONBLOCK: should it become a FIFO after the lstat, the open does not wait for a writer.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd_ < 0)
    fail("config key 'train.out_dir': cannot open the lock file '", path_,
         "': ", std::strerror(errno));
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail("config key 'train.out_dir': the lock file '", path_, "' is not a regular file");
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);

  // A record lock of the open file description (F_OFD_SETLK, Linux 3.15+): a POSIX record
  // lock as file systems see it, so NFS (v3 through lockd, v4 in the protocol), Lustre mounted
  // with `flock`, GPFS and CephFS hold it for every node, as they do fcntl locks (Linux emulates
  // flock(2) on NFS with those anyway). Owned by this descriptor, not the process: a close of
  // another descriptor of the file (a plain F_SETLK lock's pitfall) leaves it held.
  struct flock whole = {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;
  if (::fcntl(fd_, F_OFD_SETLK, &whole) != 0) {
    const int error = errno;
    if (error == EAGAIN || error == EACCES) {
      // The holder writes its details right after it takes the lock: wait a moment for them.
      std::string holder;
      for (int i = 0; i < 25 && (holder = describe_holder(read_lock_file(fd_))).empty(); ++i)
        ::usleep(20'000);
      ::close(fd_);
      fd_ = -1;
      fail("config key 'train.out_dir': '", dir, "' is in use by another run (",
           holder.empty() ? "which has not written its details yet" : holder, "; lock file ", path_,
           "): two runs in one directory overwrite each other's checkpoints and metrics. Let it "
           "finish or stop it, or give this run another train.out_dir");
    }
    if (error == ENOLCK || error == EOPNOTSUPP || error == ENOSYS || error == EINVAL) {
      log_warn("the file system of train.out_dir '", dir, "' does not lock files (",
               std::strerror(error), "): nothing keeps a second run out of this directory");
      return;
    }
    ::close(fd_);
    fd_ = -1;
    fail("config key 'train.out_dir': cannot lock '", path_, "': ", std::strerror(error));
  }
  locked_ = true;
  const std::string previous = describe_holder(read_lock_file(fd_));
  if (!previous.empty())
    log_info("train.out_dir: the lock file ", path_, " names a run that ended without releasing ",
             "it (", previous, "): it was killed or its node failed; the lock is this run's now");
  const std::string details =
      nlohmann::json({{"host", host_name()}, {"pid", int64_t(::getpid())}, {"started", utc_now()}})
          .dump() +
      "\n";
  // Only the message of another run needs them: the lock holds without them.
  if (::ftruncate(fd_, 0) != 0 || !write_all(fd_, details.data(), details.size()) ||
      ::fdatasync(fd_) != 0)
    log_warn("cannot write this run's details into the lock file ", path_, ": ",
             std::strerror(errno), " (the lock holds)");
}

RunDirLock::~RunDirLock() {
  if (fd_ < 0) return;
  if (locked_ && ::ftruncate(fd_, 0) != 0) {
    // The next run then reads these details as a dead run's, which only changes its message.
  }
  ::close(fd_);
}

}  // namespace frugal
