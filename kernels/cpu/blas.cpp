#include "kernels/cpu/blas.h"

#include <climits>

#include "core/error.h"

namespace frugal::cpu {

blasint blas_size(int64_t n) {
  FRUGAL_CHECK(n >= 0 && n <= INT_MAX, "blas size ", n);
  return static_cast<blasint>(n);
}

void use_single_threaded_blas() {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

}  // namespace frugal::cpu
