// Running a check in a child process, so that a library that crashes or hangs on damaged input
// (HDF5 on a flipped bit of a checkpoint's object headers) costs the child, not this process.
#pragma once

#include <functional>
#include <string>

namespace frugal {

struct IsolatedOutcome {
  bool ok = false;
  // ok: what `work` returned. Otherwise why it failed: its Error's message, or "crashed
  // (signal 11, Segmentation fault)", or "did not finish within 60 s".
  std::string text;
  bool crashed = false;  // ended by a signal
  bool timed_out = false;
};

// Runs `work` in a fork()ed child and returns what it returned, or why it failed. The child
// touches only what `work` touches (no MPI, no CUDA: it must not use them) and ends with
// _exit, so nothing of this process's state is flushed or finalized twice. A child still
// running after `timeout_s` is killed. A std::exception thrown by `work` is a failure with its
// message.
IsolatedOutcome run_isolated(const std::function<std::string()>& work, double timeout_s);

}  // namespace frugal
