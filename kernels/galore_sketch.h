// The entries of GaLore's randomized sketch Omega, standard normal, each a pure function of the
// seed and its index (Box-Muller on SplitMix64), shared by the CPU and CUDA kernels so that a
// sketch is drawn where it is used, the same on every rank and every device.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace frugal {

// The two uniforms of entry i: u1 in (0, 1], u2 in [0, 1), 53 random bits each, from SplitMix64
// (core/random.h's) started at seed ^ (i * an odd constant). Integer arithmetic: bit for bit the
// same on both devices. The entry is sqrt(-2 log u1) cos(2 pi u2), in float64.
FRUGAL_HOST_DEVICE inline void galore_sketch_uniforms(uint64_t seed, int64_t i, double& u1,
                                                      double& u2) {
  uint64_t state = seed ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull);
  uint64_t draws[2];
  for (uint64_t& d : draws) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    d = z ^ (z >> 31);
  }
  u1 = 1.0 - double(draws[0] >> 11) * 0x1.0p-53;
  u2 = double(draws[1] >> 11) * 0x1.0p-53;
}

}  // namespace frugal
