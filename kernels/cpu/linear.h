// Linear layers on the CPU through OpenBLAS: y = x W^T with W in Hugging Face's [out, in]
// layout, and its backward. Row-major throughout.
#pragma once
#include <cstdint>

namespace frugal::cpu {

// y[m, n] = x[m, k] . w[n, k]^T   (y overwritten)
void linear_forward(float* y, const float* x, const float* w, int64_t m, int64_t n, int64_t k);
// dx[m, k] = dy[m, n] . w[n, k]   (dx overwritten; skipped when dx is null)
// dw[n, k] += dy[m, n]^T . x[m, k] (dw accumulated, so micro-batches add up; skipped when null)
void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                     int64_t m, int64_t n, int64_t k);

}  // namespace frugal::cpu
