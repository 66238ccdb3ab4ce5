// Running checks in a child process, so that a library that crashes or hangs on damaged input
// (HDF5 on a flipped bit of a checkpoint's object headers) costs the child, not this process.
// A fork costs milliseconds (tens under AddressSanitizer), so a child checks one request after
// another until one kills it: a fork server.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

namespace frugal {

struct IsolatedOutcome {
  bool ok = false;
  // ok: what the work returned. Otherwise why it failed: its Error's message, or "crashed
  // (signal 11, Segmentation fault)", "did not finish within 60 s", or "ended without an answer
  // (exit status 1)".
  std::string text;
  bool crashed = false;  // ended by a signal
  bool timed_out = false;
  // Ended by an exit status without answering (a library that calls exit(), or a sanitizer's
  // report, which exits with a status of its own).
  bool ended = false;
};

// A child process, forked on the first request, that answers requests one after another with
// `handler` (a request in, its answer out). The handler runs in the child with this process's
// memory as it was at the fork, so a request must carry whatever changed since (paths, values).
// The child touches only what the handler touches (no MPI, no CUDA: it must not use them) and
// ends with _exit, so nothing of this process's state is flushed or finalized twice.
//
// A child that crashes, ends without an answer or is still busy after the time limit (killed)
// is replaced by a fresh fork at the next request. A child that had answered earlier requests
// may have been damaged by one of them without showing it (a corrupt heap), so such a failure
// is not blamed on the request at once: the request is run again in a fresh child, and only
// its outcome there counts. So a request is reported as crashing or hanging only when it did
// so in a child that had run nothing else.
class IsolatedWorker {
 public:
  // `reusable`, when given, is asked in the child after each answer: false ends that child
  // (a library left in a state the next request must not see), and the next request forks.
  explicit IsolatedWorker(std::function<std::string(const std::string& request)> handler,
                          std::function<bool()> reusable = nullptr);
  ~IsolatedWorker();  // the child told to end, and waited for
  IsolatedWorker(const IsolatedWorker&) = delete;
  IsolatedWorker& operator=(const IsolatedWorker&) = delete;

  // The handler's answer to `request` in the child, or why it failed (its std::exception's
  // message, its crash, or "did not finish within `timeout_s` s"). An Error when no child can
  // be made (fork or socketpair failing).
  IsolatedOutcome run(const std::string& request, double timeout_s);
  // The handler on `request` in this process, for when no child can be made.
  std::string run_here(const std::string& request) const { return handler_(request); }

  // Children forked so far (what a fork server saves is visible here).
  int forks() const { return forks_; }

 private:
  void start();
  void stop(bool kill_it);
  // One exchange with the current child; `died`: it ended (or was killed) without answering.
  IsolatedOutcome exchange(const std::string& request, double timeout_s, bool& died);

  std::function<std::string(const std::string&)> handler_;
  std::function<bool()> reusable_;
  pid_t pid_ = -1;
  int socket_ = -1;  // this process's end of the socket pair to the child
  int served_ = 0;   // requests the current child has answered
  int forks_ = 0;
};

// Runs `work` in a fork()ed child of its own and returns what it returned, or why it failed
// (as IsolatedWorker::run). A child still running after `timeout_s` is killed. A
// std::exception thrown by `work` is a failure with its message.
IsolatedOutcome run_isolated(const std::function<std::string()>& work, double timeout_s);

}  // namespace frugal
