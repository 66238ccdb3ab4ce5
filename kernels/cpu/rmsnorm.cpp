// RMSNorm as Llama uses it: y = x / sqrt(mean(x^2) + eps) * w, statistics in fp32, and its
// backward.
#include "kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>

namespace frugal::cpu {

namespace {

// dw is a sum over rows: threads own blocks of columns and walk the rows in order, so the
// result does not depend on the thread count.
constexpr int64_t kColumnBlock = 64;

}  // namespace

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows,
                     int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float sum_sq = 0.0f;
    for (int64_t j = 0; j < dim; ++j) sum_sq += xr[j] * xr[j];
    const float rs = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
    for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * rs * w[j];
    if (rstd != nullptr) rstd[r] = rs;
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t rows, int64_t dim) {
  // y_j = x_j r w_j with r = (mean x^2 + eps)^-1/2, dr/dx_j = -r^3 x_j / dim, so
  // dx_j = r (dy_j w_j) - r^3 x_j / dim * sum_k dy_k w_k x_k.
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* dyr = dy + r * dim;
    float* dxr = dx + r * dim;
    const float rs = rstd[r];
    float dot = 0.0f;
    for (int64_t j = 0; j < dim; ++j) dot += dyr[j] * w[j] * xr[j];
    const float coef = rs * rs * rs * dot / static_cast<float>(dim);
    for (int64_t j = 0; j < dim; ++j) dxr[j] = rs * dyr[j] * w[j] - coef * xr[j];
  }

  if (dw == nullptr) return;
  const int64_t n_blocks = (dim + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 14))
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t c0 = b * kColumnBlock;
    const int64_t c1 = std::min(dim, c0 + kColumnBlock);
    float acc[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * dim;
      const float* dyr = dy + r * dim;
      const float rs = rstd[r];
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += dyr[c] * xr[c] * rs;
    }
    for (int64_t c = c0; c < c1; ++c) dw[c] += acc[c - c0];
  }
}

}  // namespace frugal::cpu
