// A bias added to every row of a [rows, cols] bf16 activation (Qwen2's q/k/v projections), and
// its gradient, on the GPU; the twins of kernels/cpu/bias.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// x[r, c] += b[c], in fp32, rounded once to bf16.
void add_bias(__nv_bfloat16* x, const __nv_bfloat16* b, int64_t rows, int64_t cols,
              cudaStream_t stream);
// db[c] += sum over r of dy[r, c]: fp32 sums, rows in order (deterministic), added once.
void bias_backward(float* db, const __nv_bfloat16* dy, int64_t rows, int64_t cols,
                   cudaStream_t stream);

}  // namespace frugal::cuda
