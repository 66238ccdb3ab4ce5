// A bias added to every row of a [rows, cols] activation (Qwen2's q/k/v projections), and its
// gradient: the sum of the output gradient's rows.
#pragma once
#include <cstdint>

namespace frugal::cpu {

// x[r, c] += b[c]
void add_bias(float* x, const float* b, int64_t rows, int64_t cols);
// db[c] += sum over r of dy[r, c], summed in double and added once.
void bias_backward(float* db, const float* dy, int64_t rows, int64_t cols);

}  // namespace frugal::cpu
