// A testing aid: FRUGAL_INJECT_FAULT=KIND:RANK:STEP makes one rank misbehave at one step, to
// show that the others (or the health monitor) catch it. Read once at start-up (app/), checked
// by the loop and the health monitor here:
//   exit, hang   the rank dies (exit status 3) or stops answering as the step begins
//   signal       SIGUSR1 raised in the rank as the step begins (train/stop_signals.h)
//   nan          NaNs in the rank's gradients of the step (layers.0's first trainable tensor)
//   spike        the rank's update of the step takes 1000 x the learning rate: its weights are
//                pushed far off, and the next step's loss spikes
//   slow         the rank sleeps 0.2 s in every step from STEP on (a slow or throttled rank)
//   bitflip      one value of the rank's first replicated state tensor doubles (an exponent
//                bit flipped) as the step begins
//   recompute    the rank's recompute of layers.0 differs from its forward at that step (a
//                non-deterministic kernel)
// Faults that change values fire once: a step replayed after a rollback runs clean.
#pragma once

#include <cstdint>

namespace frugal {

struct FaultInjection {
  enum class Kind { none, exit, hang, signal, nan, spike, slow, bitflip, recompute };
  Kind kind = Kind::none;
  int rank = -1;
  int64_t step = -1;

  // This fault on this rank at this step (slow: at this step or later).
  bool at(Kind k, int on_rank, int64_t on_step) const {
    return kind == k && rank == on_rank && (k == Kind::slow ? on_step >= step : on_step == step);
  }
};

// The variable's value (nullptr: unset, no fault); an Error naming it when malformed.
FaultInjection parse_fault_injection(const char* spec);
// Dies (exit status 3), hangs, raises SIGUSR1 or sleeps when `fault` names this rank and step;
// the other kinds are the loop's and the health monitor's to inject.
void inject_fault(const FaultInjection& fault, int rank, int64_t step);

}  // namespace frugal
