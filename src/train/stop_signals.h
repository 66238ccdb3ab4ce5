// SIGUSR1, SIGTERM and a first SIGINT (Ctrl-C) ask `frugal train` to stop cleanly: the handler
// only records the signal; the loop (trainer.cpp) has every rank agree on the step to stop
// after, saves that step, and the program exits with kStoppedBySignalExitCode. Installed once
// at start-up by the app layer.
#pragma once

#include <atomic>
#include <string>

namespace frugal {

// The exit status of a run stopped by a signal after committing its checkpoint (EX_TEMPFAIL
// of sysexits.h, "try again later"): jobs/common.bash requeues the job on it.
inline constexpr int kStoppedBySignalExitCode = 75;

// Installs the SIGUSR1, SIGTERM and SIGINT handlers for the rest of the process (calling it
// again changes nothing) and returns the flag they set: 0 until one of them arrives, then the
// first one's number. The handler is async-signal-safe (lock-free atomics, write, clock_gettime,
// sigaction, raise): a second SIGUSR1 or SIGTERM, even one arriving while a checkpoint is
// written, changes nothing. A SIGINT at least half a second after the first takes its default
// action (the process ends: a user pressing Ctrl-C twice means now); one sooner is the same
// Ctrl-C delivered twice (to the process and to its group, as `timeout` and `srun` do). The
// handlers stay installed after the run: a signal arriving while MPI finalizes, the checkpoint
// committed, must not kill the process and lose its exit status.
const std::atomic<int>& install_stop_signal_handlers();

// "SIGUSR1", "SIGTERM", "SIGINT", or "signal N".
std::string signal_name(int signal);

}  // namespace frugal
