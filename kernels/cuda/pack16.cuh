// 16-byte packs for vector loads and stores (8 bf16 or 4 floats in one instruction, widened to
// float for the math), the host-side alignment test that allows them, and grid sizing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace frugal::cuda {

// Elements of one 16-byte pack of T.
template <class T>
inline constexpr int kPack = 16 / sizeof(T);

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);  // round to nearest even, as the CPU's float_to_bf16
}

// Loads one pack (p must be 16-byte aligned) and widens it to kPack<T> floats at out.
template <class T>
__device__ __forceinline__ void load_pack(float* out, const T* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  T x[kPack<T>];
  static_assert(sizeof(x) == sizeof(raw));
  memcpy(x, &raw, sizeof(raw));
#pragma unroll
  for (int k = 0; k < kPack<T>; ++k) out[k] = to_float(x[k]);
}

// Rounds kPack<T> floats at in to T and stores them as one pack (p must be 16-byte aligned).
template <class T>
__device__ __forceinline__ void store_pack(T* p, const float* in) {
  T x[kPack<T>];
#pragma unroll
  for (int k = 0; k < kPack<T>; ++k) x[k] = from_float<T>(in[k]);
  uint4 raw;
  memcpy(&raw, x, sizeof(raw));
  *reinterpret_cast<uint4*>(p) = raw;
}

// Eight elements (one bf16 pack, two fp32 packs): the unit of the vectorized elementwise
// kernels, so that bf16 and fp32 tensors share one loop shape.
inline constexpr int kGroup = 8;

template <class T>
__device__ __forceinline__ void load_group(float* out, const T* p) {
#pragma unroll
  for (int k = 0; k < kGroup; k += kPack<T>) load_pack(out + k, p + k);
}

template <class T>
__device__ __forceinline__ void store_group(T* p, const float* in) {
#pragma unroll
  for (int k = 0; k < kGroup; k += kPack<T>) store_pack(p + k, in + k);
}

// W elements at p, W = kGroup (16-byte accesses; p aligned) or 1 (any p): lets one kernel body
// serve both the vectorized path and the fallback for rows whose length is not a multiple of 8.
template <int W, class T>
__device__ __forceinline__ void load_n(float* out, const T* p) {
  static_assert(W == kGroup || W == 1);
  if constexpr (W == kGroup)
    load_group(out, p);
  else
    out[0] = to_float(p[0]);
}

template <int W, class T>
__device__ __forceinline__ void store_n(T* p, const float* in) {
  static_assert(W == kGroup || W == 1);
  if constexpr (W == kGroup)
    store_group(p, in);
  else
    p[0] = from_float<T>(in[0]);
}

// Host side: true when every pointer is 16-byte aligned (null counts as aligned).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
template <class... Ptrs>
bool all_aligned16(const Ptrs*... ptrs) {
  return (aligned16(ptrs) && ...);
}

// Blocks for a grid-stride loop over `items`: enough to fill any of our GPUs, never more than
// the work needs, at least one. The result never depends on the device, so neither do the sums
// that follow a fixed grid.
inline constexpr int64_t kMaxGridStrideBlocks = 4096;
inline unsigned grid_stride_blocks(int64_t items, int threads) {
  const int64_t needed = (items + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(needed, 1, kMaxGridStrideBlocks));
}

}  // namespace frugal::cuda
