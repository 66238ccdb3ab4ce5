// Block-wise 8-bit optimizer state (bitsandbytes' 8-bit Adam, Dettmers et al. 2022): each moment
// is stored as one byte a value, an index into a 256-entry "dynamic" code map of values in
// [-1, 1] (signed, the first moment) or [0, 1] (unsigned, the second), times the absolute
// maximum (absmax) of its block of consecutive values. The element math of one update, shared by
// the CPU twin (kernels/cpu/adamw_int8.cpp) and the CUDA kernel (kernels/cuda/adamw_int8.cu), so
// that both compute the same bits: every operation is a single IEEE-rounded float operation
// (no fused multiply-add; on the GPU the __f*_rn intrinsics, which nvcc does not contract).
//
// The order of operations is bitsandbytes' CUDA kernel's (kOptimizerStatic8bit2StateBlockwise),
// with c1 = 1 - beta1^t and c2 = sqrt(1 - beta2^t):
//   s2 = code2[q2] absmax2 beta2 + ((1 - beta2) g) g
//   s1 = code1[q1] absmax1 beta1 + (1 - beta1) g
//   absmax_k = max |s_k| over the block
//   p = p + step_size (s1 / (sqrt(s2) + c2 eps)), step_size = -lr c2 / c1
//   p = p (1 - lr wd)  (decoupled weight decay, after the step)
//   q1 = the code nearest s1 / absmax1, moved one code towards s1's sign if that code's sign
//   differs; q2 = the code nearest s2 / absmax2.
// Where bitsandbytes uses approximate intrinsics (__powf, __fdividef) frugal uses the exact
// operation, and its scalars are folded on the host in double: results may differ from
// bitsandbytes' in the last bit of a value, and a code where that bit crosses a midpoint.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"
#include "kernels/stochastic_rounding.h"  // float_bits, bf16_round_nearest

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

namespace frugal {

// bitsandbytes' block of its 8-bit blockwise optimizers (fixed there: 256 values).
constexpr int64_t kInt8StateBlock = 256;
constexpr int kInt8Codes = 256;

// The scalars of one 8-bit update, folded on the host in double from AdamWStep.
struct Int8AdamScalars {
  float beta1, beta2;
  float one_minus_b1, one_minus_b2;
  float step_size;  // -lr sqrt(1 - beta2^t) / (1 - beta1^t)
  float eps_c2;     // sqrt(1 - beta2^t) eps
  float decay;      // 1 - lr wd
  bool decays;      // wd > 0
  float grad_scale;
};

// IEEE single operations, never contracted into a fused multiply-add.
FRUGAL_HOST_DEVICE inline float int8_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;  // (the project builds with -ffp-contract=off)
#endif
}
FRUGAL_HOST_DEVICE inline float int8_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FRUGAL_HOST_DEVICE inline float int8_div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FRUGAL_HOST_DEVICE inline float int8_sqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);
#endif
}
FRUGAL_HOST_DEVICE inline float int8_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}
FRUGAL_HOST_DEVICE inline bool int8_finite(float x) {
  return (float_bits(x) & 0x7F800000u) != 0x7F800000u;
}
FRUGAL_HOST_DEVICE inline bool int8_signbit(float x) { return (float_bits(x) >> 31) != 0; }

// The index of the code nearest to x (in [-1, 1]), given the 255 midpoints (code[i] +
// code[i + 1]) * 0.5f of the sorted map: the number of midpoints below x, by an eight-step
// binary search; a value exactly on a midpoint takes the code of even index, as bitsandbytes'
// search (quantize_2D) does, whose last probe is always an even index.
FRUGAL_HOST_DEVICE inline int int8_nearest_code(const float* midpoints, float x) {
  int lo = 0;  // midpoints[0, lo) are < x
  for (int step = 128; step > 0; step >>= 1)
    if (lo + step <= kInt8Codes - 1 && midpoints[lo + step - 1] < x) lo += step;
  if (lo < kInt8Codes - 1 && (lo & 1) && midpoints[lo] == x) ++lo;
  return lo;
}

// The code of a signed moment value s in a block of absmax a: the nearest one, then (as
// bitsandbytes) one step towards s's sign where the nearest code has the other sign, so that a
// small first moment never flips its direction.
FRUGAL_HOST_DEVICE inline uint8_t int8_code_signed(const float* code, const float* midpoints,
                                                   float s, float absmax) {
  const float x = absmax > 0.0f ? int8_div(s, absmax) : 0.0f;
  int q = int8_nearest_code(midpoints, x);
  if (int8_signbit(code[q]) != int8_signbit(s)) q += s > 0.0f ? 1 : -1;
  return static_cast<uint8_t>(q);
}
FRUGAL_HOST_DEVICE inline uint8_t int8_code_unsigned(const float* midpoints, float s,
                                                     float absmax) {
  const float x = absmax > 0.0f ? int8_div(s, absmax) : 0.0f;
  return static_cast<uint8_t>(int8_nearest_code(midpoints, x));
}

// One element's moments: s1 and s2 (dequantized: code value times the block's old absmax) move
// with gradient g (already scaled). A non-finite g zeroes both (bitsandbytes: that element's
// state restarts and its weight is left alone).
FRUGAL_HOST_DEVICE inline void int8_moments(float& s1, float& s2, float g,
                                            const Int8AdamScalars& c) {
  if (!int8_finite(g)) {
    s1 = 0.0f;
    s2 = 0.0f;
    return;
  }
  s2 = int8_add(int8_mul(s2, c.beta2), int8_mul(int8_mul(c.one_minus_b2, g), g));
  s1 = int8_add(int8_mul(s1, c.beta1), int8_mul(c.one_minus_b1, g));
}

// The weight after the step, from the new moments (p unchanged for a non-finite g).
FRUGAL_HOST_DEVICE inline float int8_adam_weight(float p, float s1, float s2, float g,
                                                 const Int8AdamScalars& c) {
  if (!int8_finite(g)) return p;
  p = int8_add(p, int8_mul(c.step_size, int8_div(s1, int8_add(int8_sqrt(s2), c.eps_c2))));
  if (c.decays) p = int8_mul(p, c.decay);
  return p;
}

// A bf16 master's value (an fp32 master's bf16 copy is bf16_round_nearest of it; a bf16 master is
// stored through stochastic_rounding.h's bf16_store, as optim.bf16_rounding says).
FRUGAL_HOST_DEVICE inline float int8_load_bf16(uint16_t b) {
  return int8_float(static_cast<uint32_t>(b) << 16);
}

}  // namespace frugal
