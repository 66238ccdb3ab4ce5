// The SIGUSR1 / SIGTERM / SIGINT handler of `frugal train`: it records the signal, the loop
// does the rest.
#include "train/stop_signals.h"

#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <ctime>

namespace frugal {

namespace {

// Process-wide because a signal handler can reach nothing else; the run gets it as an argument.
std::atomic<int> received_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free int");

// When the first SIGINT came (CLOCK_MONOTONIC, ns), kNoInterrupt before. One Ctrl-C often
// arrives twice: `timeout`, `srun` and wrapper scripts signal the child and then its process
// group, microseconds apart. A SIGINT less than kSamePress after the first is that same Ctrl-C;
// a later one is a person asking again.
constexpr int64_t kNoInterrupt = INT64_MIN;
constexpr int64_t kSamePress = 500'000'000;
std::atomic<int64_t> first_interrupt_ns{kNoInterrupt};
static_assert(std::atomic<int64_t>::is_always_lock_free,
              "the signal handler needs a lock-free int64");

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec now = {};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

void say(const char* text, size_t size) {
  if (::write(STDERR_FILENO, text, size) < 0) {
  }
}

extern "C" void record_stop_signal(int signal) {
  int none = 0;
  received_stop_signal.compare_exchange_strong(none, signal);  // the first one is named
  if (signal != SIGINT) return;
  const int64_t now = monotonic_ns();
  int64_t first = kNoInterrupt;
  if (first_interrupt_ns.compare_exchange_strong(first, now)) {
    // At a terminal: say at once what the key did (write is signal-safe).
    static const char note[] =
        "\nfrugal: Ctrl-C: stopping after this step, with a checkpoint (Ctrl-C again: at once, "
        "unsaved)\n";
    say(note, sizeof note - 1);
    return;
  }
  if (now - first < kSamePress) return;  // the same Ctrl-C, delivered twice
  // Ctrl-C again: the default action, which ends the process. SIGINT is blocked while this
  // handler runs, so the raised one is taken as the handler returns.
  struct sigaction default_action = {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(SIGINT, &default_action, nullptr);
  raise(SIGINT);
}

}  // namespace

const std::atomic<int>& install_stop_signal_handlers() {
  struct sigaction action = {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write the signal interrupts just goes on
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // Ctrl-C: the first one stops after the step like SIGTERM; a second one, pressed later, ends
  // the process at once. A SIGINT ignored when the program started (a background job of a
  // script) stays ignored, as is the custom.
  struct sigaction previous = {};
  sigaction(SIGINT, nullptr, &previous);
  if (previous.sa_handler != SIG_IGN) sigaction(SIGINT, &action, nullptr);
  return received_stop_signal;
}

std::string signal_name(int signal) {
  if (signal == SIGUSR1) return "SIGUSR1";
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGINT) return "SIGINT";
  return "signal " + std::to_string(signal);
}

}  // namespace frugal
