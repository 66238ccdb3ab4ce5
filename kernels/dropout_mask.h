// The keep/drop decision of inverted dropout, one pure function of (seed, element index) that
// the CPU and CUDA kernels share, so a mask is never stored: the backward, a recompute and the
// other backend all draw the same one.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace frugal {

// Whether element i survives dropout with probability p of dropping: a SplitMix64 hash of
// (seed, i), its top 24 bits as a uniform u in [0, 1) (exact in fp32), kept when u >= p.
FRUGAL_HOST_DEVICE inline bool dropout_keeps(uint64_t seed, int64_t i, float p) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(i) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  return u >= p;
}

}  // namespace frugal
