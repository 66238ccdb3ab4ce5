// Small elementwise helpers the model needs between the big kernels, on the GPU: in bf16 for
// activations (residual adds), in fp32 for gradient buffers (accumulation, clipping).
//
// One grid-stride kernel template serves all three, the operation a template parameter. Where
// the pointers are 16-byte aligned each thread moves 8 elements per iteration with 16-byte
// loads; the tail (n % 8) and misaligned tensors go one element at a time. The math is fp32 and
// rounds as the CPU's (no fused multiply-add), so fp32 results match the CPU bit for bit.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"

#include <algorithm>

#include "kernels/dropout_mask.h"
#include "kernels/cuda/pack16.cuh"

namespace frugal::cuda {

namespace {

constexpr int kThreads = 256;

// What the kernel computes per element; the launcher picks one.
enum class Op { add, scale, add_scaled };

template <Op kOp>
__device__ __forceinline__ float apply(float y, float x, float s) {
  if constexpr (kOp == Op::add) return y + x;
  if constexpr (kOp == Op::scale) return y * s;
  // Written as a product then a sum, rounded separately as the CPU's y += s * x (no FMA).
  return __fadd_rn(y, __fmul_rn(s, x));
}

template <class T, class TX, Op kOp, bool kVec>
__global__ void elementwise_kernel(T* y, const TX* x, float s, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_groups = kVec ? n / kGroup : 0;
  for (int64_t g = first; g < n_groups; g += stride) {
    float yv[kGroup], xv[kGroup] = {};
    load_group(yv, y + g * kGroup);
    if constexpr (kOp != Op::scale) load_group(xv, x + g * kGroup);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) yv[k] = apply<kOp>(yv[k], xv[k], s);
    store_group(y + g * kGroup, yv);
  }
  for (int64_t i = n_groups * kGroup + first; i < n; i += stride) {
    const float xi = kOp == Op::scale ? 0.0f : to_float(x[i]);
    y[i] = from_float<T>(apply<kOp>(to_float(y[i]), xi, s));
  }
}

template <Op kOp, class T, class TX>
void launch_elementwise(T* y, const TX* x, float s, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (all_aligned16(y, x)) {
    const unsigned blocks = grid_stride_blocks((n + kGroup - 1) / kGroup, kThreads);
    elementwise_kernel<T, TX, kOp, true><<<blocks, kThreads, 0, stream>>>(y, x, s, n);
  } else {
    const unsigned blocks = grid_stride_blocks(n, kThreads);
    elementwise_kernel<T, TX, kOp, false><<<blocks, kThreads, 0, stream>>>(y, x, s, n);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  launch_elementwise<Op::add>(y, x, 0.0f, n, stream);
}
void add_inplace(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n, cudaStream_t stream) {
  launch_elementwise<Op::add>(y, x, 0.0f, n, stream);
}
void add_inplace(__nv_bfloat16* y, const float* x, int64_t n, cudaStream_t stream) {
  launch_elementwise<Op::add>(y, x, 0.0f, n, stream);
}
void scale_inplace(float* y, float s, int64_t n, cudaStream_t stream) {
  launch_elementwise<Op::scale>(y, static_cast<const float*>(nullptr), s, n, stream);
}
void scale_inplace(__nv_bfloat16* y, float s, int64_t n, cudaStream_t stream) {
  launch_elementwise<Op::scale>(y, static_cast<const __nv_bfloat16*>(nullptr), s, n, stream);
}
namespace {
__global__ void dropout_kernel(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n, float p,
                               float scale, uint64_t seed, int64_t first) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(dropout_keeps(seed, first + i, p) ? __bfloat162float(x[i]) * scale : 0.0f);
}
}  // namespace

void dropout(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n, float p, uint64_t seed,
             int64_t first, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  dropout_kernel<<<unsigned(blocks), 256, 0, stream>>>(y, x, n, p, 1.0f / (1.0f - p), seed, first);
  CUDA_CHECK_LAUNCH();
}

void add_scaled_inplace(float* y, const float* x, float s, int64_t n, cudaStream_t stream) {
  launch_elementwise<Op::add_scaled>(y, x, s, n, stream);
}
void add_scaled_inplace(__nv_bfloat16* y, const __nv_bfloat16* x, float s, int64_t n,
                        cudaStream_t stream) {
  launch_elementwise<Op::add_scaled>(y, x, s, n, stream);
}

}  // namespace frugal::cuda
