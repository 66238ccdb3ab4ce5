// Row-broadcast bias and its gradient (bias.h).
#include "kernels/cpu/bias.h"

#include <vector>

namespace frugal::cpu {

void add_bias(float* x, const float* b, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] += b[c];
}

void bias_backward(float* db, const float* dy, int64_t rows, int64_t cols) {
  // Columns split over threads, rows in order within each: the same sums whatever the threads.
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
  for (int64_t c = 0; c < cols; ++c) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) sum += dy[r * cols + c];
    db[c] += static_cast<float>(sum);
  }
}

}  // namespace frugal::cpu
