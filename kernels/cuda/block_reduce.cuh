// Warp- and block-wide sums by shuffles, in a fixed order so that a result is the same on every
// run (the tree depends only on blockDim, never on timing).
#pragma once

#include <cuda_runtime.h>

namespace frugal::cuda {

inline constexpr int kWarpSize = 32;

template <class T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Sum of x over the block, returned to every thread. blockDim.x must be a multiple of 32 (at
// most 1024); `scratch` is 32 values of shared memory. Contains __syncthreads, so every thread
// of the block must call it.
template <class T>
__device__ __forceinline__ T block_sum(T x, T* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  x = warp_sum(x);
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < n_warps ? scratch[lane] : T(0);
  return warp_sum(x);
}

}  // namespace frugal::cuda
