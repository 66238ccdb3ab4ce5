// FP8 casts with a per-tensor scale, the reference (and CPU backend) for kernels/cuda/fp8.cu:
// code = encode(x * scale), round to nearest even, saturating to the format's largest finite
// value as TransformerEngine casts, with an optional transposed copy, the tensor's amax and
// counts of the values that flush to zero or saturate. And the scale recipes' update step.
#pragma once

#include <cstdint>

namespace frugal::cpu {

// E4M3 ("fn": max 448, no infinity, NaN = 0x7F/0xFF) for activations and weights; E5M2 (max
// 57344, IEEE-like with infinities and NaNs) for gradients.
enum class Fp8Format : uint8_t { e4m3, e5m2 };

float fp8_max(Fp8Format format);
// One value: encode(x) with round to nearest even, +-inf and values past max to +-max, NaN to
// the format's NaN code (the sign kept).
uint8_t fp8_encode(float x, Fp8Format format);
float fp8_decode(uint8_t code, Fp8Format format);

// What a cast saw: values cast, non-zero inputs that became a zero code (underflow), and
// inputs whose scaled magnitude exceeded the format's max (overflow, cast to +-max).
struct Fp8CastCounts {
  int64_t values = 0, flushed = 0, saturated = 0;
};

// |x| as the bit pattern of a non-negative float: the max of these over a tensor is its amax,
// and a NaN (0x7FC00000 and up) wins over any number, as it does on the GPU (atomicMax on
// the same bits), so a NaN amax reaches the recipe, which then keeps its scale.
inline uint32_t amax_bits(uint32_t float_bits) { return float_bits & 0x7FFFFFFFu; }

// x [rows, cols] row-major; out [rows, cols] and/or out_t [cols, rows] (either may be null)
// receive encode(x * scale). Returns max |x| (of the unscaled input; NaN when x holds one) and
// adds to counts (may be null).
float fp8_cast_transpose(const float* x, int64_t rows, int64_t cols, float scale, Fp8Format format,
                         uint8_t* out, uint8_t* out_t, Fp8CastCounts* counts);
// max |x| alone (current scaling's first pass), NaN when x holds one.
float fp8_amax(const float* x, int64_t n);
// out[i] = decode(in[i]) * scale_inv.
void fp8_dequantize(float* out, const uint8_t* in, int64_t n, Fp8Format format, float scale_inv);
// out [cols, rows] = the transpose of codes in [rows, cols]: the dgrad operand W^T of a weight
// gathered as FP8 (its codes are already cast, so the transpose moves bytes only).
void fp8_transpose_codes(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols);

// The scale a tensor with this amax gets: fp8_max / amax * 2^-margin (ldexp: exact, so the GPU's
// twin gets the same float); when amax is zero or not
// finite the previous scale stays (nothing to learn from it), and a quotient past the float
// range becomes the largest float (TransformerEngine's rule).
float fp8_scale_from_amax(float amax, float previous_scale, float fp8_max_value, int margin);

// Delayed scaling's step end for `slots` tensors at once. history is [history_len, slots]
// row-major, row 0 this step's amax (already reduced over the ranks that share each tensor).
// For each slot: amax = max over the history's rows, scale = fp8_scale_from_amax(amax, ...),
// scale_inv = 1 / scale; then the history rolls (row i+1 = old row i, the oldest dropped) and
// row 0 is zeroed for the next step's casts. max_values [slots]: each slot's format max.
void fp8_delayed_update(float* history, float* scale, float* scale_inv, const float* max_values,
                        int64_t history_len, int64_t slots, int margin);

}  // namespace frugal::cpu
