// Row-broadcast bias and its gradient on the GPU (bias.h).
//
// add_bias: one thread per element, a grid-stride loop. bias_backward: one thread per column,
// walking the rows in order, so the sum is the same on every run; neighbouring threads read
// neighbouring columns of a row, so the loads coalesce. A bias gradient is a few thousand
// columns over one micro-batch's tokens: small next to the GEMMs around it.
#include <algorithm>

#include "kernels/cuda/bias.h"
#include "kernels/cuda/cuda_check.h"

namespace frugal::cuda {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

__global__ void add_bias_kernel(bf16* x, const bf16* b, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(b[i % cols]));
}

__global__ void bias_backward_kernel(float* db, const bf16* dy, int64_t rows, int64_t cols) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int64_t r = 0; r < rows; ++r) sum += __bfloat162float(dy[r * cols + c]);
  db[c] += sum;
}

}  // namespace

void add_bias(bf16* x, const bf16* b, int64_t rows, int64_t cols, cudaStream_t stream) {
  FRUGAL_CHECK(rows >= 0 && cols > 0, "add_bias of ", rows, " x ", cols);
  const int64_t n = rows * cols;
  if (n == 0) return;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  add_bias_kernel<<<blocks, kThreads, 0, stream>>>(x, b, rows, cols);
  CUDA_CHECK_LAUNCH();
}

void bias_backward(float* db, const bf16* dy, int64_t rows, int64_t cols, cudaStream_t stream) {
  FRUGAL_CHECK(rows >= 0 && cols > 0, "bias_backward of ", rows, " x ", cols);
  const auto blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
  bias_backward_kernel<<<blocks, kThreads, 0, stream>>>(db, dy, rows, cols);
  CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::cuda
