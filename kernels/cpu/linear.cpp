// Linear layers through OpenBLAS's cblas_sgemm: y = x W^T with W in Hugging Face's [out, in]
// layout, and its backward. Row-major throughout.
//
// OpenBLAS runs single-threaded and each product is split into blocks of output rows or columns,
// one per OpenMP thread (kernels/cpu/blas.h says why). Every output element is still one
// sgemm's dot product over the full reduction axis, so results do not depend on the thread
// count's timing (only on the partition, which is fixed for a thread count).
#include "kernels/cpu/linear.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>

#include "core/error.h"
#include "kernels/cpu/blas.h"

namespace frugal::cpu {

namespace {

// Splits [0, n) into `parts` nearly equal blocks; block i is [begin, end).
void block_of(int64_t n, int parts, int i, int64_t& begin, int64_t& end) {
  begin = n * i / parts;
  end = n * (i + 1) / parts;
}

// Threads worth using for a product with `rows` output rows of `work` flops: small products
// are not worth waking the team for.
int threads_for(int64_t rows, double work) {
  const int most = omp_get_max_threads();
  if (work < 2e5) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(most, rows)));
}

}  // namespace

void linear_forward(float* y, const float* x, const float* w, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum; sgemm with k = 0 is a quick return in some BLAS builds
    std::fill(y, y + m * n, 0.0f);
    return;
  }
  use_single_threaded_blas();
  const blasint N = blas_size(n), K = blas_size(k);
  blas_size(m);
  // Split y by rows when there are enough, else by columns (rows of w).
  const bool by_rows = m >= n || m >= 4 * omp_get_max_threads();
  const int parts = threads_for(by_rows ? m : n, 2.0 * m * n * k);
#pragma omp parallel for num_threads(parts) schedule(static, 1)
  for (int part = 0; part < parts; ++part) {
    int64_t b, e;
    block_of(by_rows ? m : n, parts, part, b, e);
    if (e == b) continue;
    if (by_rows)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(e - b), N, K, 1.0f, x + b * k, K,
                  w, K, 0.0f, y + b * n, N);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(m), blasint(e - b), K, 1.0f, x,
                  K, w + b * k, K, 0.0f, y + b, N);
  }
}

void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                     int64_t m, int64_t n, int64_t k) {
  if (m == 0 || k == 0) return;  // dx is empty; dw gains an empty sum
  use_single_threaded_blas();
  const blasint M = blas_size(m), N = blas_size(n), K = blas_size(k);
  const double work = 2.0 * m * n * k;
  if (dx != nullptr) {
    if (n == 0) {
      std::fill(dx, dx + m * k, 0.0f);
    } else {
      // dx[m, k] = dy[m, n] . w[n, k], split by rows of dx
      const int parts = threads_for(m, work);
#pragma omp parallel for num_threads(parts) schedule(static, 1)
      for (int part = 0; part < parts; ++part) {
        int64_t b, e;
        block_of(m, parts, part, b, e);
        if (e > b)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(e - b), K, N, 1.0f,
                      dy + b * n, N, w, K, 0.0f, dx + b * k, K);
      }
    }
  }
  if (dw != nullptr && n != 0) {
    // dw[n, k] += dy[m, n]^T . x[m, k], split by rows of dw (columns of dy) when there are
    // enough, else by its columns (columns of x)
    const bool by_rows = n >= k || n >= 4 * omp_get_max_threads();
    const int parts = threads_for(by_rows ? n : k, work);
#pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int part = 0; part < parts; ++part) {
      int64_t b, e;
      block_of(by_rows ? n : k, parts, part, b, e);
      if (e == b) continue;
      if (by_rows)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blasint(e - b), K, M, 1.0f, dy + b, N,
                    x, K, 1.0f, dw + b * k, K);
      else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, blasint(e - b), M, 1.0f, dy, N,
                    x + b, K, 1.0f, dw + b, K);
    }
  }
}

}  // namespace frugal::cpu
