// A testing aid: FRUGAL_INJECT_FAULT=exit:RANK:STEP or hang:RANK:STEP makes that rank die or
// stop answering at that step, to show that the others report it instead of hanging;
// signal:RANK:STEP raises SIGUSR1 in that rank as the step begins, so a test of the clean stop
// (train/stop_signals.h) knows the step every rank stops after. Read once at start-up (app/),
// checked every step here.
#pragma once

#include <cstdint>

namespace frugal {

struct FaultInjection {
  enum class Kind { none, exit, hang, signal };
  Kind kind = Kind::none;
  int rank = -1;
  int64_t step = -1;
};

// The variable's value (nullptr: unset, no fault); an Error naming it when malformed.
FaultInjection parse_fault_injection(const char* spec);
// Dies (exit status 3), hangs or raises SIGUSR1 when `fault` names this rank and step.
void inject_fault(const FaultInjection& fault, int rank, int64_t step);

}  // namespace frugal
