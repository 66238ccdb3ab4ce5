// SwiGLU's gate: h = silu(g) * u, silu(g) = g * sigmoid(g), elementwise, and its backward.
#include "kernels/cpu/swiglu.h"

#include <cmath>

namespace frugal::cpu {

namespace {

constexpr int64_t kParallelThreshold = 1 << 14;

// 1 / (1 + e^-g): for g very negative e^-g overflows to inf and the result is 0, as it should.
inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

void swiglu_forward(float* h, const float* g, const float* u, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(g[i]);
    const float silu = g[i] * s;
    // d silu / dg = s + g s (1 - s)
    dg[i] = dh[i] * u[i] * (s + silu * (1.0f - s));
    du[i] = dh[i] * silu;
  }
}

}  // namespace frugal::cpu
