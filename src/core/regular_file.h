// Opening a file that a user, a script or damage may have replaced by something else. A FIFO
// blocks open() until a writer comes (forever, in an unattended run), a device such as
// /dev/zero reads without end, a directory reads as an empty file or fails deep inside a
// stream, a symlink loop fails with ELOOP: every file frugal reads goes through here first, and
// anything but a regular file is an Error naming the path and what it is.
#pragma once

#include <cstdint>
#include <string>

namespace frugal {

// What `path` is when it is not a regular file, symlinks followed: "a FIFO (named pipe)", "a
// directory", "a socket", "a character device", "a block device", "a symlink loop" (ELOOP),
// "missing" (ENOENT, or a dangling symlink), or why it cannot be looked at ("not accessible:
// Permission denied"); "" for a regular file. Looks with stat(): nothing is opened.
std::string non_regular_kind(const std::string& path);

// An Error "<what> '<path>' is a FIFO (named pipe), not a regular file" (or "... does not
// exist", or "... cannot be read: <reason>") unless `path` is a regular file. For paths a
// library opens itself (HDF5, SentencePiece): checked just before it does.
void require_regular_file(const std::string& path, const std::string& what);

// A regular file open for reading. The path is looked at first (so a device is never opened:
// opening one can have effects), then opened with O_NONBLOCK (a FIFO put there after the look
// cannot block the open) and the descriptor itself checked with fstat: what is read is what
// was checked. Owns the descriptor.
class RegularFile {
 public:
  // `what` names the file in messages ("safetensors file", "config file", ...).
  RegularFile(const std::string& path, const std::string& what);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  int fd() const { return fd_; }
  int64_t size_bytes() const { return size_bytes_; }  // at the open
  const std::string& path() const { return path_; }

  // Up to `max_bytes` from the start (fewer when the file is shorter).
  std::string read_prefix(size_t max_bytes) const;
  // The whole file; an Error naming it when it is larger than `max_bytes`.
  std::string read_all(size_t max_bytes) const;

 private:
  std::string path_, what_;
  int fd_ = -1;
  int64_t size_bytes_ = 0;
};

// The whole of the regular file `path` (RegularFile's checks), at most `max_bytes` (1 GiB by
// default: a config or a pointer file that large is damage, not something to hold in memory).
std::string read_regular_file(const std::string& path, const std::string& what,
                              size_t max_bytes = size_t(1) << 30);

}  // namespace frugal
