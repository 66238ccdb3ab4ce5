// Parsing FRUGAL_INJECT_FAULT, and the faults that need no part of the run.
#include "train/fault_injection.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"

namespace frugal {

namespace {

struct KindName {
  FaultInjection::Kind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {FaultInjection::Kind::exit, "exit"},       {FaultInjection::Kind::hang, "hang"},
    {FaultInjection::Kind::signal, "signal"},   {FaultInjection::Kind::nan, "nan"},
    {FaultInjection::Kind::spike, "spike"},     {FaultInjection::Kind::slow, "slow"},
    {FaultInjection::Kind::bitflip, "bitflip"}, {FaultInjection::Kind::recompute, "recompute"}};

const char* kind_name(FaultInjection::Kind kind) {
  for (const KindName& k : kKinds)
    if (k.kind == kind) return k.name;
  return "none";
}

}  // namespace

FaultInjection parse_fault_injection(const char* spec) {
  FaultInjection fault;
  if (!spec || !*spec) return fault;
  char kind[16] = {0};
  int rank = -1, consumed = 0;
  long long step = -1;
  const bool parsed = std::sscanf(spec, "%15[a-z]:%d:%lld%n", kind, &rank, &step, &consumed) == 3 &&
                      spec[consumed] == '\0' && rank >= 0 && step >= 1;
  const std::string name = kind;
  bool known = false;
  for (const KindName& k : kKinds)
    if (name == k.name) {
      fault.kind = k.kind;
      known = true;
    }
  if (!parsed || !known)
    fail("FRUGAL_INJECT_FAULT is '", spec,
         "': expected KIND:RANK:STEP with KIND one of exit, hang, signal, nan, spike, slow, "
         "bitflip, recompute");
  fault.rank = rank;
  fault.step = step;
  return fault;
}

void inject_fault(const FaultInjection& fault, int rank, int64_t step) {
  using Kind = FaultInjection::Kind;
  if (fault.at(Kind::slow, rank, step)) {
    if (step == fault.step)
      std::fprintf(stderr, "frugal: rank %d: injected fault 'slow' from step %lld on\n", rank,
                   static_cast<long long>(step));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return;
  }
  if (fault.rank != rank || fault.step != step) return;
  if (fault.kind != Kind::exit && fault.kind != Kind::hang && fault.kind != Kind::signal) return;
  std::fprintf(stderr, "frugal: rank %d: injected fault '%s' at step %lld\n", rank,
               kind_name(fault.kind), static_cast<long long>(step));
  if (fault.kind == Kind::exit) std::_Exit(3);
  if (fault.kind == Kind::signal) {
    std::raise(SIGUSR1);  // handled on this thread before raise returns
    return;
  }
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace frugal
