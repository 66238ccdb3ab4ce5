// Dense linear algebra on the host through OpenBLAS (cblas_sgemm) and its LAPACK (dsyevd,
// dpotrf, dtrtri).
//
// LAPACK is column-major. A row-major matrix is its transpose in column-major, so a symmetric
// matrix reads the same either way; the factors come back transposed and are turned round
// here, on the small matrices these are called with (at most a few thousand rows).
//
// The matrix product runs as one sgemm per block of output rows, one block per OpenMP thread,
// with OpenBLAS single-threaded (kernels/cpu/blas.h).
#include "kernels/cpu/dense.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/blas.h"

extern "C" {
// Fortran LAPACK: every argument by address; the trailing size_t are the lengths of the
// character arguments (gfortran's hidden arguments; harmless for a C implementation).
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
             double* work, const int* lwork, int* iwork, const int* liwork, int* info,
             size_t jobz_len, size_t uplo_len);
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info, size_t uplo_len);
void dtrtri_(const char* uplo, const char* diag, const int* n, double* a, const int* lda, int* info,
             size_t uplo_len, size_t diag_len);
}

namespace frugal::cpu {

namespace {

int lapack_size(int64_t n) {
  FRUGAL_CHECK(n >= 1 && n <= INT_MAX, "LAPACK matrix size ", n);
  return static_cast<int>(n);
}

}  // namespace

void matmul(float* c, const float* a, bool trans_a, const float* b, bool trans_b, int64_t m,
            int64_t n, int64_t k, float alpha, float beta) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  use_single_threaded_blas();
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  const int threads = std::max(1, std::min<int>(omp_get_max_threads(), int((m + 31) / 32)));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const int64_t first = m * t / threads, last = m * (t + 1) / threads;
    if (last == first) continue;
    // Rows [first, last) of op(a): rows of a, or columns of a when it is transposed.
    const float* a_rows = trans_a ? a + first : a + first * lda;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, blas_size(last - first), blas_size(n),
                blas_size(k), alpha, a_rows, blas_size(lda), b, blas_size(ldb), beta, c + first * n,
                blas_size(n));
  }
}

void symmetric_eigen(double* a, double* values, int64_t n) {
  const int size = lapack_size(n);
  int info = 0, lwork = -1, liwork = -1, iwork_query = 0;
  double work_query = 0;
  dsyevd_("V", "U", &size, a, &size, values, &work_query, &lwork, &iwork_query, &liwork, &info, 1,
          1);
  FRUGAL_CHECK(info == 0, "dsyevd workspace query of a ", n, "x", n, " matrix: info ", info);
  lwork = static_cast<int>(work_query);
  liwork = iwork_query;
  std::vector<double> work(static_cast<size_t>(lwork));
  std::vector<int> iwork(static_cast<size_t>(liwork));
  dsyevd_("V", "U", &size, a, &size, values, work.data(), &lwork, iwork.data(), &liwork, &info, 1,
          1);
  FRUGAL_CHECK(info == 0, "dsyevd of a ", n, "x", n, " symmetric matrix did not converge (info ",
               info, ")");
  // Column-major columns are the eigenvectors: read row-major, they are already rows.
}

bool cholesky_upper(double* a, int64_t n) {
  const int size = lapack_size(n);
  int info = 0;
  // Row-major a is column-major a^T = a. dpotrf("L") gives column-major L with a = L L^T,
  // which read row-major is L^T: the upper r with a = r^T r.
  dpotrf_("L", &size, a, &size, &info, 1);
  FRUGAL_CHECK(info >= 0, "dpotrf argument ", -info, " of a ", n, "x", n, " matrix");
  if (info > 0) return false;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < i; ++j) a[i * n + j] = 0.0;  // row-major below the diagonal
  return true;
}

void invert_upper(double* a, int64_t n) {
  const int size = lapack_size(n);
  int info = 0;
  // Row-major upper is column-major lower.
  dtrtri_("L", "N", &size, a, &size, &info, 1, 1);
  FRUGAL_CHECK(info == 0, "dtrtri of a ", n, "x", n, " triangular matrix: info ", info,
               info > 0 ? " (a zero on the diagonal)" : "");
}

}  // namespace frugal::cpu
