// Box-Muller in double with the host's libm; each pair drawn from its own position in its row's
// stream (kernels/normal_init.h).
#include "kernels/cpu/normal_init.h"

#include <cmath>

#include "kernels/normal_init.h"

namespace frugal::cpu {

namespace {

// Pair p's two values: radius cos and radius sin of the angle 2 pi u2.
inline void normal_pair(uint64_t key, int64_t row, int64_t pair, float std, float* even,
                        float* odd) {
  double u1, u2;
  normal_pair_uniforms(key, row, pair, &u1, &u2);
  const double radius = std::sqrt(-2.0 * std::log(u1));
  *even = static_cast<float>(std * radius * std::cos(2.0 * M_PI * u2));
  *odd = static_cast<float>(std * radius * std::sin(2.0 * M_PI * u2));
}

}  // namespace

void normal_rows(float* out, int64_t rows, int64_t row_len, uint64_t key, int64_t first_row,
                 float std) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * row_len;
    for (int64_t j = 0; j < row_len; j += 2) {
      float even, odd;
      normal_pair(key, first_row + r, j / 2, std, &even, &odd);
      row[j] = even;
      if (j + 1 < row_len) row[j + 1] = odd;
    }
  }
}

float normal_value(uint64_t key, int64_t row, int64_t col, float std) {
  float even, odd;
  normal_pair(key, row, col / 2, std, &even, &odd);
  return col % 2 == 0 ? even : odd;
}

}  // namespace frugal::cpu
