// Dense linear algebra on the host: the fp32 matrix product of any two operands (transposed or
// not) through OpenBLAS, and the small float64 factorisations GaLore's projector needs
// (symmetric eigen-decomposition, Cholesky, triangular inverse) through OpenBLAS's LAPACK.
// Row-major throughout.
#pragma once
#include <cstdint>

namespace frugal::cpu {

// c[m, n] = alpha * op(a) . op(b) + beta * c, op(a) [m, k] (a stored [k, m] when trans_a),
// op(b) [k, n] (b stored [n, k] when trans_b). With k = 0 the product is zero: c = beta * c.
void matmul(float* c, const float* a, bool trans_a, const float* b, bool trans_b, int64_t m,
            int64_t n, int64_t k, float alpha, float beta);

// Eigen-decomposition of the symmetric a [n, n] (dsyevd): values[n] ascending; on return row i
// of a holds the unit eigenvector of values[i].
void symmetric_eigen(double* a, double* values, int64_t n);

// The upper-triangular r [n, n] with a = r^T r (dpotrf), written over a (below the diagonal
// zeroed). Returns false when a is not positive definite (a is then undefined).
bool cholesky_upper(double* a, int64_t n);

// The inverse of the upper-triangular a [n, n], in place (dtrtri); the diagonal must be
// non-zero.
void invert_upper(double* a, int64_t n);

}  // namespace frugal::cpu
