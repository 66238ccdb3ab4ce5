// Stochastic rounding of fp32 values into bf16 master weights, and its random bits: pure
// functions that the CPU and CUDA kernels share, so that every device and every sharding of a
// weight rounds each element alike (optim.bf16_rounding = stochastic).
//
// A bf16 weight keeps 8 significant bits: an update smaller than half a unit in the last place
// is lost entirely by round-to-nearest, which stalls training late in a run when the steps get
// small. Rounding up with probability equal to the fraction of the way to the next bf16 value
// (and down otherwise) makes the stored value unbiased, E[round(x)] = x, so small updates
// accumulate in expectation.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"
#include "kernels/normal_init.h"  // splitmix64_mix

namespace frugal {

// x's bits: __float_as_uint on a GPU, memcpy on the host (both free after optimization).
FRUGAL_HOST_DEVICE inline uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

// value rounded to bf16 (its bits) with the low 16 bits of `random`: those are added to the
// 16 bits that bf16 drops, and a carry rounds the magnitude up. With uniform random bits the
// carry happens with probability (dropped bits) / 65536, the fraction of the way from the
// bf16 value below in magnitude to the one above: unbiased for either sign. A value that is
// already a bf16 value (dropped bits 0) never carries and passes unchanged. NaN stays NaN
// (quiet bit set, as float_to_bf16 keeps it); +-inf stays +-inf; a finite value beyond the
// largest finite bf16 (0x7F7F) rounds up to inf with the probability of its fraction, as the
// next value up is inf. Branch-free so the host loops vectorize.
FRUGAL_HOST_DEVICE inline uint16_t bf16_round_stochastic(float value, uint32_t random) {
  const uint32_t bits = float_bits(value);
  const uint32_t rounded = (bits + (random & 0xFFFFu)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  // inf's dropped bits are zero, so inf never carries into a NaN pattern.
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

// The key of one tensor's rounding at one optimizer step: the run's seed, the 1-based step and
// the parameter's id (parameter_rounding_id of its name), mixed by SplitMix64's finalizer.
FRUGAL_HOST_DEVICE inline uint64_t stochastic_rounding_key(uint64_t seed, int64_t step,
                                                           uint64_t parameter_id) {
  return splitmix64_mix(splitmix64_mix(seed ^ parameter_id) +
                        static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull);
}

// The random bits of element `element` of the FULL parameter (a shard adds its first row times
// the row length to its own index), under `key`: draw element + 1 of the SplitMix64 stream
// that starts at the key, its high 32 bits. A counter: any element is drawn without the others,
// so the bits do not depend on the number of ranks, the device or the thread order.
FRUGAL_HOST_DEVICE inline uint32_t stochastic_rounding_bits(uint64_t key, int64_t element) {
  const uint64_t counter = static_cast<uint64_t>(element) + 1;
  return static_cast<uint32_t>(splitmix64_mix(key + counter * 0x9E3779B97F4A7C15ull) >> 32);
}

// How an updated weight is stored into a bf16 master: to nearest even (stochastic false), or
// stochastically with the bits of element first_element + i under key.
struct Bf16Store {
  bool stochastic = false;
  uint64_t key = 0;
  int64_t first_element = 0;  // the full parameter's index of the tensor's element 0
};

// value rounded to bf16 to nearest even: core/dtype.h's float_to_bf16, here for device code
// too (integer arithmetic, the same bits on both devices; a NaN keeps its top bits, quieted).
FRUGAL_HOST_DEVICE inline uint16_t bf16_round_nearest(float value) {
  const uint32_t bits = float_bits(value);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

// Element i of a tensor stored into its bf16 master as `store` says.
FRUGAL_HOST_DEVICE inline uint16_t bf16_store(float value, const Bf16Store& store, int64_t i) {
  return store.stochastic ? bf16_round_stochastic(
                                value, stochastic_rounding_bits(store.key, store.first_element + i))
                          : bf16_round_nearest(value);
}

// A 64-bit id of a parameter's name (FNV-1a), for stochastic_rounding_key: the same name gives
// the same id in every process.
inline uint64_t parameter_rounding_id(const char* name, size_t length) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < length; ++i) h = (h ^ static_cast<uint8_t>(name[i])) * 0x100000001B3ull;
  return h;
}

}  // namespace frugal
