// Linear layers through OpenBLAS's cblas_sgemm: y = x W^T with W in Hugging Face's [out, in]
// layout, and its backward. Row-major throughout.
#include "kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>
#include <climits>

#include "core/error.h"

namespace frugal::cpu {

namespace {

// cblas takes int sizes; a matrix side beyond INT_MAX is a caller bug, not a user error.
blasint blas_size(int64_t n) {
  FRUGAL_CHECK(n >= 0 && n <= INT_MAX, "blas size ", n);
  return static_cast<blasint>(n);
}

}  // namespace

void linear_forward(float* y, const float* x, const float* w, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum; sgemm with k = 0 is a quick return in some BLAS builds
    std::fill(y, y + m * n, 0.0f);
    return;
  }
  const blasint M = blas_size(m), N = blas_size(n), K = blas_size(k);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
}

void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                     int64_t m, int64_t n, int64_t k) {
  if (m == 0 || k == 0) return;  // dx is empty; dw gains an empty sum
  const blasint M = blas_size(m), N = blas_size(n), K = blas_size(k);
  if (dx != nullptr) {
    if (n == 0) {
      std::fill(dx, dx + m * k, 0.0f);
    } else {
      // dx[m, k] = dy[m, n] . w[n, k]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dy, N, w, K, 0.0f, dx,
                  K);
    }
  }
  if (dw != nullptr && n != 0) {
    // dw[n, k] += dy[m, n]^T . x[m, k]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K);
  }
}

}  // namespace frugal::cpu
