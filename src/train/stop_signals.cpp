// The SIGUSR1 / SIGTERM / SIGINT handler of `frugal train`: it records the signal, the loop
// does the rest.
#include "train/stop_signals.h"

#include <unistd.h>

#include <csignal>

namespace frugal {

namespace {

// Process-wide because a signal handler can reach nothing else; the run gets it as an argument.
std::atomic<int> received_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free int");

extern "C" void record_stop_signal(int signal) {
  int none = 0;
  received_stop_signal.compare_exchange_strong(none, signal);  // the first one is named
  if (signal == SIGINT) {  // at a terminal: say at once what the key did (write is signal-safe)
    static const char note[] =
        "\nfrugal: Ctrl-C: stopping after this step, with a checkpoint (Ctrl-C again: at once, "
        "unsaved)\n";
    if (::write(STDERR_FILENO, note, sizeof note - 1) < 0) {
    }
  }
}

}  // namespace

const std::atomic<int>& install_stop_signal_handlers() {
  struct sigaction action = {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write the signal interrupts just goes on
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // Ctrl-C: the first one stops after the step like SIGTERM; the handler then gives way to the
  // default (SA_RESETHAND), so a second one ends the process at once. A SIGINT ignored when the
  // program started (a background job of a script) stays ignored, as is the custom.
  struct sigaction previous = {};
  sigaction(SIGINT, nullptr, &previous);
  if (previous.sa_handler != SIG_IGN) {
    struct sigaction once = action;
    once.sa_flags |= SA_RESETHAND;
    sigaction(SIGINT, &once, nullptr);
  }
  return received_stop_signal;
}

std::string signal_name(int signal) {
  if (signal == SIGUSR1) return "SIGUSR1";
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGINT) return "SIGINT";
  return "signal " + std::to_string(signal);
}

}  // namespace frugal
