// SwiGLU's gate: h = silu(g) * u, silu(g) = g * sigmoid(g), elementwise.
#pragma once
#include <cstdint>

namespace frugal::cpu {

void swiglu_forward(float* h, const float* g, const float* u, int64_t n);
// dg, du overwritten.
void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     int64_t n);

}  // namespace frugal::cpu
