// The seeded normal initialisation of a weight's rows on the GPU: the numbers of
// frugal::cpu::normal_rows (kernels/cpu/normal_init.h), bit for bit once the host has redone the
// few values this kernel hands over.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// out[rows * row_len] as cpu::normal_rows(out, rows, row_len, key, first_row, std), one thread
// per Box-Muller pair. The GPU's double log, cos and sin may differ from the host libm's by a
// few ulps; where that could change the fp32 result (the double value lies within a relative
// 2^-40 of a rounding boundary of fp32, about 1 value in 10^5) the flat index goes to
// uncertain[*uncertain_count] (atomically; past `capacity` only the count grows) for the host to
// redo with cpu::normal_value. *uncertain_count must be zero before the launch.
void normal_rows(float* out, int64_t rows, int64_t row_len, uint64_t key, int64_t first_row,
                 float std, int64_t* uncertain, unsigned long long* uncertain_count,
                 int64_t capacity, cudaStream_t stream);

// out[index[i]] = values[i] for i < n: the host's values put in place.
void scatter_values(float* out, const int64_t* index, const float* values, int64_t n,
                    cudaStream_t stream);

}  // namespace frugal::cuda
