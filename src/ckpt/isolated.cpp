// fork(), a pipe for the child's answer, and a bounded wait.
#include "ckpt/isolated.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/error.h"

namespace frugal {

namespace {

// Writes all of `text` to fd (the child's end of the pipe).
void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += size_t(n);
  }
}

}  // namespace

IsolatedOutcome run_isolated(const std::function<std::string()>& work, double timeout_s) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail("cannot create a pipe: ", std::strerror(errno));
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    fail("cannot fork a process to check a file: ", std::strerror(err));
  }
  if (pid == 0) {
    ::close(fds[0]);
    // A crash ends the child at once, by its signal: a handler inherited from this process
    // (Open MPI installs one that prints a backtrace) could deadlock in a damaged heap.
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) ::signal(sig, SIG_DFL);
    // The answer: 'o' and the result, or 'e' and the error.
    std::string answer;
    try {
      const std::string result = work();
      answer = 'o';
      answer += result;
    } catch (const std::exception& e) {
      answer = std::string("e") + e.what();
    } catch (...) {
      answer = "eunknown exception";
    }
    write_all(fds[1], answer);
    ::_exit(0);
  }
  ::close(fds[1]);

  // Read the answer while it comes (a large one would fill the pipe and block the child), until
  // the child closes its end, or the time is up.
  IsolatedOutcome outcome;
  std::string answer;
  const auto start = std::chrono::steady_clock::now();
  bool eof = false;
  while (!eof) {
    const double left =
        timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (left <= 0) {
      outcome.timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, int(std::min(left, 1.0) * 1000) + 1);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buffer[4096];
    const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      eof = true;
    else
      answer.append(buffer, size_t(n));
  }
  ::close(fds[0]);
  if (outcome.timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (outcome.timed_out) {
    char text[64];
    std::snprintf(text, sizeof text, "did not finish within %g s", timeout_s);
    outcome.text = text;
  } else if (WIFSIGNALED(status)) {
    outcome.crashed = true;
    outcome.text = "crashed (signal " + std::to_string(WTERMSIG(status)) + ", " +
                   ::strsignal(WTERMSIG(status)) + ")";
  } else if (!answer.empty() && answer[0] == 'o') {
    outcome.ok = true;
    outcome.text = answer.substr(1);
  } else if (!answer.empty() && answer[0] == 'e') {
    outcome.text = answer.substr(1);
  } else {
    outcome.text = "ended without an answer (exit status " +
                   std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")";
  }
  return outcome;
}

}  // namespace frugal
