// Parsing FRUGAL_INJECT_FAULT, and the faults themselves.
#include "train/fault_injection.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"

namespace frugal {

FaultInjection parse_fault_injection(const char* spec) {
  FaultInjection fault;
  if (!spec || !*spec) return fault;
  char kind[8] = {0};
  int rank = -1, consumed = 0;
  long long step = -1;
  const bool parsed = std::sscanf(spec, "%7[a-z]:%d:%lld%n", kind, &rank, &step, &consumed) == 3 &&
                      spec[consumed] == '\0' && rank >= 0 && step >= 1;
  const std::string name = kind;
  if (!parsed || (name != "exit" && name != "hang" && name != "signal"))
    fail("FRUGAL_INJECT_FAULT is '", spec,
         "': expected exit:RANK:STEP, hang:RANK:STEP or signal:RANK:STEP");
  fault.kind = name == "exit"   ? FaultInjection::Kind::exit
               : name == "hang" ? FaultInjection::Kind::hang
                                : FaultInjection::Kind::signal;
  fault.rank = rank;
  fault.step = step;
  return fault;
}

void inject_fault(const FaultInjection& fault, int rank, int64_t step) {
  if (fault.kind == FaultInjection::Kind::none || fault.rank != rank || fault.step != step) return;
  const char* name = fault.kind == FaultInjection::Kind::exit   ? "exit"
                     : fault.kind == FaultInjection::Kind::hang ? "hang"
                                                                : "signal";
  std::fprintf(stderr, "frugal: rank %d: injected fault '%s' at step %lld\n", rank, name,
               static_cast<long long>(step));
  if (fault.kind == FaultInjection::Kind::exit) std::_Exit(3);
  if (fault.kind == FaultInjection::Kind::signal) {
    std::raise(SIGUSR1);  // handled on this thread before raise returns
    return;
  }
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace frugal
