// The seeded normal initialisation's random stream, one pure function of (row key, row, pair)
// that the CPU and CUDA kernels share: every element of a weight is drawn from its own row's
// stream, so a row's numbers do not depend on which rank (or device) makes them.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace frugal {

// SplitMix64's output for state `state` (the state after its increment).
FRUGAL_HOST_DEVICE inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The two uniforms of Box-Muller pair `pair` (elements 2 pair and 2 pair + 1) of row `row`:
// u1 in (0, 1] (a finite log), u2 in [0, 1), both exact in double. The row's SplitMix64 stream
// starts at key ^ (0xD1B54A32D192ED03 (row + 1)); the pair takes its draws 2 pair + 1 and
// 2 pair + 2, so any pair can be drawn without the ones before it (SplitMix64 is a counter).
FRUGAL_HOST_DEVICE inline void normal_pair_uniforms(uint64_t key, int64_t row, int64_t pair,
                                                    double* u1, double* u2) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  const uint64_t start = key ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(row + 1));
  const uint64_t state = start + 2 * static_cast<uint64_t>(pair) * kGolden;
  *u1 = (static_cast<double>(splitmix64_mix(state + kGolden) >> 11) + 1.0) * 0x1.0p-53;
  *u2 = static_cast<double>(splitmix64_mix(state + 2 * kGolden) >> 11) * 0x1.0p-53;
}

}  // namespace frugal
