// Small elementwise helpers the model needs between the big kernels.
#include "kernels/cpu/elementwise.h"

#include "core/dtype.h"
#include "kernels/dropout_mask.h"

namespace frugal::cpu {

// Below this many elements a thread team costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 15;

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void add_inplace(uint16_t* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(bf16_to_float(y[i]) + x[i]);
}

void scale_inplace(float* y, float s, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

void add_scaled_inplace(float* y, const float* x, float s, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) y[i] += s * x[i];
}

void dropout(float* y, const float* x, int64_t n, float p, uint64_t seed, int64_t first) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) y[i] = dropout_keeps(seed, first + i, p) ? x[i] * scale : 0.0f;
}

void f32_to_bf16(uint16_t* out, const float* in, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

void bf16_to_f32(float* out, const uint16_t* in, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

}  // namespace frugal::cpu
