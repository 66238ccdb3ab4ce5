// Parsing FRUGAL_INJECT_FAULT, and the faults themselves.
#include "train/fault_injection.h"

#include <chrono>
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
  if (std::sscanf(spec, "%7[a-z]:%d:%lld%n", kind, &rank, &step, &consumed) != 3 ||
      spec[consumed] != '\0' || rank < 0 || step < 1 ||
      (std::string(kind) != "exit" && std::string(kind) != "hang"))
    fail("FRUGAL_INJECT_FAULT is '", spec, "': expected exit:RANK:STEP or hang:RANK:STEP");
  fault.kind =
      std::string(kind) == "exit" ? FaultInjection::Kind::exit : FaultInjection::Kind::hang;
  fault.rank = rank;
  fault.step = step;
  return fault;
}

void inject_fault(const FaultInjection& fault, int rank, int64_t step) {
  if (fault.kind == FaultInjection::Kind::none || fault.rank != rank || fault.step != step) return;
  const bool exits = fault.kind == FaultInjection::Kind::exit;
  std::fprintf(stderr, "frugal: rank %d: injected fault '%s' at step %lld\n", rank,
               exits ? "exit" : "hang", static_cast<long long>(step));
  if (exits) std::_Exit(3);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace frugal
