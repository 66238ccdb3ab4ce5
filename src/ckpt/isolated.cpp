// fork(), a socket pair for requests and answers, and a bounded wait for each answer.
//
// On the socket: a request is its length (8 bytes) and its bytes; an answer is 'o' (the result)
// or 'e' (an error's message), then '1' when the child ends after it or '0', then the length
// and the bytes.
#include "ckpt/isolated.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/error.h"

namespace frugal {

namespace {

constexpr size_t kAnswerHeader = 2 + sizeof(uint64_t);

// Sends all of `bytes` (MSG_NOSIGNAL: a peer that is gone is an error, not a SIGPIPE).
bool send_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

// Reads exactly `size` bytes, blocking; false at the end of the stream or on an error.
bool read_exactly(int fd, char* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, out + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

std::string with_length(const std::string& prefix, const std::string& bytes) {
  const uint64_t length = bytes.size();
  std::string message = prefix;
  message.append(reinterpret_cast<const char*>(&length), sizeof length);
  message += bytes;
  return message;
}

// The child: answers requests until the stream ends, or `reusable` says no more.
[[noreturn]] void serve(int fd, const std::function<std::string(const std::string&)>& handler,
                        const std::function<bool()>& reusable) {
  // A crash ends the child at once, by its signal: a handler inherited from this process
  // (Open MPI installs one that prints a backtrace) could deadlock in a damaged heap.
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) ::signal(sig, SIG_DFL);
  for (;;) {
    uint64_t length = 0;
    if (!read_exactly(fd, reinterpret_cast<char*>(&length), sizeof length)) ::_exit(0);
    std::string request(length, '\0');
    if (!read_exactly(fd, request.data(), length)) ::_exit(0);
    char kind = 'o';
    std::string text;
    try {
      text = handler(request);
    } catch (const std::exception& e) {
      kind = 'e';
      text = e.what();
    } catch (...) {
      kind = 'e';
      text = "unknown exception";
    }
    const bool last = reusable && !reusable();
    if (!send_all(fd, with_length(std::string{kind, last ? '1' : '0'}, text)) || last) ::_exit(0);
  }
}

}  // namespace

IsolatedWorker::IsolatedWorker(std::function<std::string(const std::string&)> handler,
                               std::function<bool()> reusable)
    : handler_(std::move(handler)), reusable_(std::move(reusable)) {}

IsolatedWorker::~IsolatedWorker() { stop(/*kill_it=*/true); }

void IsolatedWorker::start() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    fail("cannot create a socket pair: ", std::strerror(errno));
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
    serve(fds[1], handler_, reusable_);
  }
  ::close(fds[1]);
  pid_ = pid;
  socket_ = fds[0];
  served_ = 0;
  ++forks_;
}

void IsolatedWorker::stop(bool kill_it) {
  if (socket_ >= 0) ::close(socket_);
  socket_ = -1;
  if (pid_ <= 0) return;
  // Killed, not merely told by the end of its stream: another child forked since holds a copy
  // of this process's end, so the stream would not end.
  if (kill_it) ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

IsolatedOutcome IsolatedWorker::exchange(const std::string& request, double timeout_s, bool& died) {
  IsolatedOutcome outcome;
  died = false;
  // Read the answer while it comes (a large one would fill the socket and block the child),
  // until it is whole, the child is gone, or the time is up.
  std::string answer;
  bool whole = false;
  bool reaped = false;  // the child's end is known (status) without the end of its stream
  int status = 0;
  if (send_all(socket_, with_length("", request))) {
    const auto start = std::chrono::steady_clock::now();
    while (!whole) {
      const double left =
          timeout_s -
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (left <= 0) {
        outcome.timed_out = true;
        break;
      }
      pollfd p{socket_, POLLIN, 0};
      const int ready = ::poll(&p, 1, int(std::min(left, 1.0) * 1000) + 1);
      if (ready < 0 && errno != EINTR) break;
      if (ready == 0) {
        // A child forked meanwhile by another thread may hold a copy of the child's end of the
        // socket, so a crash need not end the stream: ask for the child itself.
        reaped = ::waitpid(pid_, &status, WNOHANG) == pid_;
        if (reaped) break;
      }
      if (ready <= 0) continue;
      char buffer[65536];
      const ssize_t n = ::read(socket_, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the child is gone
      answer.append(buffer, size_t(n));
      if (answer.size() >= kAnswerHeader) {
        uint64_t length = 0;
        std::memcpy(&length, answer.data() + 2, sizeof length);
        whole = answer.size() == kAnswerHeader + length;
      }
    }
  }
  if (whole) {
    ++served_;
    outcome.ok = answer[0] == 'o';
    outcome.text = answer.substr(kAnswerHeader);
    if (answer[1] == '1') stop(/*kill_it=*/false);  // it ends by itself
    return outcome;
  }
  died = true;
  if (outcome.timed_out) ::kill(pid_, SIGKILL);
  ::close(socket_);
  socket_ = -1;
  while (!reaped && ::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  if (outcome.timed_out) {
    char text[64];
    std::snprintf(text, sizeof text, "did not finish within %g s", timeout_s);
    outcome.text = text;
  } else if (WIFSIGNALED(status)) {
    outcome.crashed = true;
    outcome.text = "crashed (signal " + std::to_string(WTERMSIG(status)) + ", " +
                   ::strsignal(WTERMSIG(status)) + ")";
  } else {
    outcome.ended = true;
    outcome.text = "ended without an answer (exit status " +
                   std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")";
  }
  return outcome;
}

IsolatedOutcome IsolatedWorker::run(const std::string& request, double timeout_s) {
  if (pid_ <= 0) start();
  const bool fresh = served_ == 0;
  bool died = false;
  IsolatedOutcome outcome = exchange(request, timeout_s, died);
  if (!died || fresh) return outcome;
  // The child had answered other requests first: the request is judged in a fresh one.
  start();
  return exchange(request, timeout_s, died);
}

IsolatedOutcome run_isolated(const std::function<std::string()>& work, double timeout_s) {
  IsolatedWorker worker([&](const std::string&) { return work(); }, [] { return false; });
  return worker.run("", timeout_s);
}

}  // namespace frugal
