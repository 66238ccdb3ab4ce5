// The seeded normal initialisation of a weight's rows on the CPU (Box-Muller in double on the
// streams of kernels/normal_init.h), the twin of kernels/cuda/normal_init.h.
#pragma once

#include <cstdint>

namespace frugal::cpu {

// out[r * row_len + j] for r < rows: element j of row first_row + r, std * N(0, 1) rounded to
// fp32. Pair p of a row gives elements 2p (the cosine) and 2p + 1 (the sine; dropped past an
// odd row's end). OpenMP over rows.
void normal_rows(float* out, int64_t rows, int64_t row_len, uint64_t key, int64_t first_row,
                 float std);

// Element col of row `row`, the number normal_rows makes for it.
float normal_value(uint64_t key, int64_t row, int64_t col, float std);

}  // namespace frugal::cpu
