// FP8 casts and the scale update on the CPU; see fp8.h. The encoding is core/dtype's (round to
// nearest even, saturating), which tests/unit/test_dtype checks against brute-force rounding.
#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>

#include "core/dtype.h"

namespace frugal::cpu {

float fp8_max(Fp8Format format) { return format == Fp8Format::e4m3 ? kE4M3Max : kE5M2Max; }

uint8_t fp8_encode(float x, Fp8Format format) {
  return format == Fp8Format::e4m3 ? float_to_e4m3(x) : float_to_e5m2(x);
}

float fp8_decode(uint8_t code, Fp8Format format) {
  return format == Fp8Format::e4m3 ? e4m3_to_float(code) : e5m2_to_float(code);
}

namespace {

// One element: its code, and what it adds to the counts. |x * scale| > max saturates (an
// infinite product too); a non-zero, non-NaN x whose code is +-0 flushed.
struct Cast {
  uint8_t code;
  bool flushed, saturated;
};

inline Cast cast_one(float x, float scale, Fp8Format format, float max_value) {
  const float scaled = x * scale;
  const uint8_t code = fp8_encode(scaled, format);
  return {code, x != 0.0f && !std::isnan(x) && (code & 0x7F) == 0, std::fabs(scaled) > max_value};
}

}  // namespace

float fp8_cast_transpose(const float* x, int64_t rows, int64_t cols, float scale, Fp8Format format,
                         uint8_t* out, uint8_t* out_t, Fp8CastCounts* counts) {
  const float max_value = fp8_max(format);
  uint32_t amax = 0;
  int64_t flushed = 0, saturated = 0;
#pragma omp parallel for schedule(static) reduction(max : amax) reduction(+ : flushed, saturated) \
    if (rows * cols >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[r * cols + c];
      amax = std::max(amax, amax_bits(std::bit_cast<uint32_t>(v)));
      const Cast cast = cast_one(v, scale, format, max_value);
      if (out) out[r * cols + c] = cast.code;
      if (out_t) out_t[c * rows + r] = cast.code;
      flushed += cast.flushed;
      saturated += cast.saturated;
    }
  if (counts) {
    counts->values += rows * cols;
    counts->flushed += flushed;
    counts->saturated += saturated;
  }
  return std::bit_cast<float>(amax);
}

float fp8_amax(const float* x, int64_t n) {
  uint32_t amax = 0;
#pragma omp parallel for schedule(static) reduction(max : amax) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, amax_bits(std::bit_cast<uint32_t>(x[i])));
  return std::bit_cast<float>(amax);
}

void fp8_dequantize(float* out, const uint8_t* in, int64_t n, Fp8Format format, float scale_inv) {
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) out[i] = fp8_decode(in[i], format) * scale_inv;
}

void fp8_transpose_codes(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 15))
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) out[c * rows + r] = in[r * cols + c];
}

float fp8_scale_from_amax(float amax, float previous_scale, float fp8_max_value, int margin) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous_scale;
  const float scale = std::ldexp(fp8_max_value / amax, -margin);
  return std::isfinite(scale) ? scale : FLT_MAX;
}

void fp8_delayed_update(float* history, float* scale, float* scale_inv, const float* max_values,
                        int64_t history_len, int64_t slots, int margin) {
  for (int64_t s = 0; s < slots; ++s) {
    uint32_t amax = 0;
    for (int64_t i = 0; i < history_len; ++i)
      amax = std::max(amax, amax_bits(std::bit_cast<uint32_t>(history[i * slots + s])));
    scale[s] = fp8_scale_from_amax(std::bit_cast<float>(amax), scale[s], max_values[s], margin);
    scale_inv[s] = 1.0f / scale[s];
    for (int64_t i = history_len - 1; i > 0; --i)
      history[i * slots + s] = history[(i - 1) * slots + s];
    history[s] = 0.0f;
  }
}

}  // namespace frugal::cpu
