// SplitMix64: a tiny, well-mixed, counter-based generator whose output is the same on every
// platform and compiler (std::normal_distribution and friends are not), so initialisation
// and sampling are reproducible across Debian and Ubuntu builds.
#pragma once

#include <cstdint>

namespace frugal {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1), 53 random bits.
inline double uniform01(uint64_t& state) { return double(splitmix64(state) >> 11) * 0x1.0p-53; }

}  // namespace frugal
