// Putting something other than a regular file where frugal reads one: a FIFO (whose open blocks
// until a writer comes), a directory, a symlink loop, a device (a symlink to /dev/zero, which
// reads without end), a dangling symlink. For the unit tests, the fuzz targets and
// tools/ckpt_sweep, which check that every reader refuses each by name and nothing blocks.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/isolated.h"
#include "core/error.h"

namespace frugal::test {

enum class OddFile { fifo, directory, symlink_loop, device, dangling_symlink };

inline const std::vector<OddFile>& odd_files() {
  static const std::vector<OddFile> all = {OddFile::fifo, OddFile::directory, OddFile::symlink_loop,
                                           OddFile::device, OddFile::dangling_symlink};
  return all;
}

inline const char* odd_file_name(OddFile kind) {
  switch (kind) {
    case OddFile::fifo:
      return "fifo";
    case OddFile::directory:
      return "directory";
    case OddFile::symlink_loop:
      return "symlink loop";
    case OddFile::device:
      return "device";
    case OddFile::dangling_symlink:
      return "dangling symlink";
  }
  return "?";
}

// What core/regular_file.h's messages call it.
inline const char* odd_file_said(OddFile kind) {
  switch (kind) {
    case OddFile::fifo:
      return "a FIFO (named pipe)";
    case OddFile::directory:
      return "a directory";
    case OddFile::symlink_loop:
      return "a symlink loop";
    case OddFile::device:
      return "a character device";
    case OddFile::dangling_symlink:
      return "a symlink to a missing file";
  }
  return "?";
}

// Replaces whatever is at `path` (a file, or a directory with everything in it) by `kind`.
inline void make_odd_file(const std::string& path, OddFile kind) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::remove_all(path, ec);
  const std::string name = fs::path(path).filename().string();
  bool made = false;
  switch (kind) {
    case OddFile::fifo:
      made = ::mkfifo(path.c_str(), 0644) == 0;
      break;
    case OddFile::directory:
      made = fs::create_directory(path, ec);
      break;
    case OddFile::symlink_loop:
      made = ::symlink(name.c_str(), path.c_str()) == 0;
      break;
    case OddFile::device:
      made = ::symlink("/dev/zero", path.c_str()) == 0;
      break;
    case OddFile::dangling_symlink:
      made = ::symlink((name + ".nowhere").c_str(), path.c_str()) == 0;
      break;
  }
  if (!made) fail("cannot make a ", odd_file_name(kind), " at '", path, "'");
}

// `read` in a child process given `limit_s` seconds: "" when it threw an Error that names
// `path` and `said`, else what went wrong (it returned, blocked, crashed, or its message lacks
// the path or the kind). A reader that blocks on a FIFO fails here instead of hanging.
inline std::string refusal_problem(const std::function<void()>& read, const std::string& path,
                                   const std::string& said, double limit_s = 20) {
  const IsolatedOutcome outcome = run_isolated(
      [&] {
        read();
        return std::string("read it");
      },
      limit_s);
  if (outcome.ok) return "it was read without an error";
  if (outcome.timed_out || outcome.crashed) return outcome.text;
  if (outcome.text.find(path) == std::string::npos)
    return "the message does not name the path: " + outcome.text;
  if (outcome.text.find(said) == std::string::npos)
    return "the message does not say '" + said + "': " + outcome.text;
  return "";
}

}  // namespace frugal::test
