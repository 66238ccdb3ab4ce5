// RMSNorm as Llama uses it: y = x / sqrt(mean(x^2) + eps) * w, statistics in fp32.
#pragma once
#include <cstdint>

namespace frugal::cpu {

// y[r, :] = x[r, :] * rstd[r] * w;  rstd[r] = 1 / sqrt(mean_j x[r, j]^2 + eps) is saved for
// the backward (rstd may be null when not needed).
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows,
                     int64_t dim, float eps);
// dx[r, :] (overwritten) and dw (accumulated; skipped when null) from dy, x, w and the saved
// rstd.
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t rows, int64_t dim);

}  // namespace frugal::cpu
