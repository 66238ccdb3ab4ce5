// The exclusive lock on a run's output directory (train.out_dir): one run at a time writes its
// checkpoints and metrics there. Held by rank 0 from before the run writes anything until it
// ends; the kernel (or the file server) releases it when the process dies.
#pragma once

#include <string>

namespace frugal {

class RunDirLock {
 public:
  // Creates `dir` when needed and locks its file "train.lock" (a record lock of the open file,
  // fcntl F_OFD_SETLK, never waiting), then writes this process's host, pid and start time into it
  // for the message another run gets. An Error naming the directory and the holder (host, pid,
  // start) when another process holds it. A lock file holding another process's details
  // although nobody holds the lock was left by a run that died: it is taken over, with a line
  // saying whose it was. Where the file system has no locks (ENOLCK, EOPNOTSUPP: Lustre mounted
  // without `flock`), a warning says the directory is not protected, and the run goes on.
  explicit RunDirLock(const std::string& dir);
  // Empties the lock file (a clean end leaves no holder's details), then releases the lock.
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  static constexpr const char* kFileName = "train.lock";
  const std::string& path() const { return path_; }
  bool locked() const { return locked_; }

 private:
  std::string path_;
  int fd_ = -1;
  bool locked_ = false;
};

}  // namespace frugal
