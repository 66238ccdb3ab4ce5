// SwiGLU's gate on the GPU: h = silu(g) * u, silu(g) = g * sigmoid(g), elementwise; bf16 in and
// out, fp32 math.
//
// Grid-stride kernels; with 16-byte aligned tensors each thread handles 8 elements per
// iteration through one 16-byte load per input, the tail (n % 8) one element at a time. The
// sigmoid is 1 / (1 + expf(-g)) as on the CPU (expf, not __expf: the fast one is off by a few
// ulp, more than the CPU comparison needs); for g very negative expf overflows to inf and the
// sigmoid is 0, as it should be.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pack16.cuh"
#include "kernels/cuda/swiglu.h"

namespace frugal::cuda {

namespace {

constexpr int kThreads = 256;
using bf16 = __nv_bfloat16;

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <bool kVec>
__global__ void swiglu_forward_kernel(bf16* h, const bf16* g, const bf16* u, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_groups = kVec ? n / kGroup : 0;
  for (int64_t q = first; q < n_groups; q += stride) {
    float gv[kGroup], uv[kGroup], hv[kGroup];
    load_group(gv, g + q * kGroup);
    load_group(uv, u + q * kGroup);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) hv[k] = gv[k] * sigmoid(gv[k]) * uv[k];
    store_group(h + q * kGroup, hv);
  }
  for (int64_t i = n_groups * kGroup + first; i < n; i += stride) {
    const float gi = __bfloat162float(g[i]);
    h[i] = __float2bfloat16_rn(gi * sigmoid(gi) * __bfloat162float(u[i]));
  }
}

// dg = dh u (s + silu (1 - s)), du = dh silu: d silu / dg = s + g s (1 - s).
__device__ __forceinline__ void swiglu_grad(float& dg, float& du, float dh, float g, float u) {
  const float s = sigmoid(g);
  const float silu = g * s;
  dg = dh * u * (s + silu * (1.0f - s));
  du = dh * silu;
}

template <bool kVec>
__global__ void swiglu_backward_kernel(bf16* dg, bf16* du, const bf16* dh, const bf16* g,
                                       const bf16* u, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_groups = kVec ? n / kGroup : 0;
  for (int64_t q = first; q < n_groups; q += stride) {
    float dhv[kGroup], gv[kGroup], uv[kGroup], dgv[kGroup], duv[kGroup];
    load_group(dhv, dh + q * kGroup);
    load_group(gv, g + q * kGroup);
    load_group(uv, u + q * kGroup);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) swiglu_grad(dgv[k], duv[k], dhv[k], gv[k], uv[k]);
    store_group(dg + q * kGroup, dgv);
    store_group(du + q * kGroup, duv);
  }
  for (int64_t i = n_groups * kGroup + first; i < n; i += stride) {
    float dgi, dui;
    swiglu_grad(dgi, dui, __bfloat162float(dh[i]), __bfloat162float(g[i]), __bfloat162float(u[i]));
    dg[i] = __float2bfloat16_rn(dgi);
    du[i] = __float2bfloat16_rn(dui);
  }
}

unsigned blocks_for(int64_t n, bool vec) {
  return grid_stride_blocks(vec ? (n + kGroup - 1) / kGroup : n, kThreads);
}

}  // namespace

void swiglu_forward(bf16* h, const bf16* g, const bf16* u, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (all_aligned16(h, g, u))
    swiglu_forward_kernel<true><<<blocks_for(n, true), kThreads, 0, stream>>>(h, g, u, n);
  else
    swiglu_forward_kernel<false><<<blocks_for(n, false), kThreads, 0, stream>>>(h, g, u, n);
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(bf16* dg, bf16* du, const bf16* dh, const bf16* g, const bf16* u, int64_t n,
                     cudaStream_t stream) {
  if (n <= 0) return;
  if (all_aligned16(dg, du, dh, g, u))
    swiglu_backward_kernel<true><<<blocks_for(n, true), kThreads, 0, stream>>>(dg, du, dh, g, u, n);
  else
    swiglu_backward_kernel<false>
        <<<blocks_for(n, false), kThreads, 0, stream>>>(dg, du, dh, g, u, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::cuda
