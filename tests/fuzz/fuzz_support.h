// What every fuzz target shares. frugal's readers take paths and memory-map or stream what they
// read, as they do in a run, so each input is written to a file first: under /dev/shm (a RAM
// file system) when there is one, in a directory private to the process and removed at exit.
//
// The rule every target applies: a frugal::Error is the answer to bad input (it names the
// file); anything else that escapes (another exception, a crash, a sanitizer's report, a
// leak, a hang) is a finding, which libFuzzer saves and tools/fuzz turns into a regression
// input under tests/fuzz/regressions/<target>/.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/log.h"

// Where tools/fuzz closes the code's stderr, a sanitizer's report still reaches libFuzzer's log:
// a target's own finding goes the same way (weak: the replay build has no sanitizer).
extern "C" __attribute__((weak)) void __sanitizer_report_error_summary(const char* summary);

namespace frugal::fuzz {

// A finding of the target's own (a wrong answer rather than a crash): said where the log shows
// it, then abort() (libFuzzer saves the input).
[[noreturn]] inline void finding(const std::string& what) {
  const std::string line = "finding: " + what;
  if (__sanitizer_report_error_summary)
    __sanitizer_report_error_summary(line.c_str());
  else
    std::fprintf(stderr, "%s\n", line.c_str());
  abort();
}

// This process's scratch directory (made on first use, removed at exit).
inline const std::string& scratch_dir() {
  // Never destroyed: the exit handler that removes the directory runs after static destructors
  // of objects made before it was registered, this one included.
  static const std::string* const dir = [] {
    std::error_code ec;
    const char* base = std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : "/tmp";
    auto* made = new std::string(std::string(base) + "/frugal-fuzz-XXXXXX");
    if (mkdtemp(made->data()) == nullptr) abort();
    // Info lines would cost more than the parsing; warnings stay (tools/fuzz closes stderr).
    set_log_quiet(true);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(scratch_dir(), ignored);
    });
    return made;
  }();
  return *dir;
}

// Writes `size` bytes to scratch_dir()/relative (its directories made as needed), replacing
// what was there, and returns the path.
inline std::string write_scratch(const std::string& relative, const uint8_t* data, size_t size) {
  const std::filesystem::path path = std::filesystem::path(scratch_dir()) / relative;
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) abort();
  return path.string();
}

inline std::string write_scratch(const std::string& relative, const std::string& text) {
  return write_scratch(relative, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

// What scratch_dir()/relative holds.
inline std::string read_scratch(const std::string& relative) {
  std::ifstream in(std::filesystem::path(scratch_dir()) / relative, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Replaces scratch_dir()/relative for its lifetime, then puts back what it held.
class ScratchReplacement {
 public:
  ScratchReplacement(std::string relative, const std::string& text)
      : relative_(std::move(relative)), saved_(read_scratch(relative_)) {
    write_scratch(relative_, text);
  }
  ~ScratchReplacement() { write_scratch(relative_, saved_); }
  ScratchReplacement(const ScratchReplacement&) = delete;
  ScratchReplacement& operator=(const ScratchReplacement&) = delete;

 private:
  std::string relative_, saved_;
};

}  // namespace frugal::fuzz
