// Dequantization of 4-bit base weights on the GPU, one matrix at a time into a reused bf16
// buffer: NF4 with double-quantized absmax (quant/nf4.h) and HQQ (quant/hqq.h); and NF4's first
// level (codes and block absmax), for random bases made on the GPU.
//
// Each thread of a grid-stride loop expands 4 code bytes into 8 values, which never straddle a
// 64-element block; with a 16-byte aligned output they go out in one 16-byte store. The tables
// (16 + 256 floats) are a __grid_constant__ kernel parameter: read from the constant bank, no
// per-device global state. The arithmetic uses __fmul_rn / __fadd_rn so that nvcc cannot fuse
// it into an FMA: the result is the CPU's fp32 value rounded to bf16, bit for bit, and does not
// depend on the grid (each output is computed by exactly one thread).
#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/four_bit.cuh"
#include "kernels/cuda/pack16.cuh"
#include "kernels/cuda/quant.h"

namespace frugal::cuda {

namespace {

constexpr int kThreads = 256;
using bf16 = __nv_bfloat16;
static_assert(kGroup == kFourBitGroup);

template <bool kVec>
__device__ __forceinline__ void store_eight(bf16* out, const float* v) {
  if constexpr (kVec) {
    store_group(out, v);
  } else {
#pragma unroll
    for (int k = 0; k < kGroup; ++k) out[k] = __float2bfloat16_rn(v[k]);
  }
}

template <bool kVec>
__global__ void nf4_dequantize_kernel(bf16* out, const Nf4Device w,
                                      const __grid_constant__ Nf4Tables tables, int64_t groups) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < groups;
       q += stride) {
    float v[kGroup];
    nf4_eight(v, w, tables, q * kGroup);
    store_eight<kVec>(out + q * kGroup, v);
  }
}

template <bool kVec>
__global__ void hqq_dequantize_kernel(bf16* out, const HqqDevice w, int64_t groups) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < groups;
       q += stride) {
    float v[kGroup];
    hqq_eight(v, w, q * kGroup);
    store_eight<kVec>(out + q * kGroup, v);
  }
}

struct Nf4Midpoints {
  float at[15];
};

// Block b's 64 values: lane l holds elements 2l and 2l + 1 and writes their code byte. The
// arithmetic is the CPU's, correctly rounded (__fdiv_rn, __fmul_rn), so the codes are equal.
__global__ void nf4_quantize_kernel(uint8_t* codes, float* absmax, const float* w, int64_t blocks,
                                    const __grid_constant__ Nf4Midpoints mid,
                                    unsigned long long* bad_block) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; b < blocks;
       b += warps) {
    const float2 x = reinterpret_cast<const float2*>(w + b * kFourBitBlock)[lane];
    const bool finite = isfinite(x.x) && isfinite(x.y);
    float amax = fmaxf(fabsf(x.x), fabsf(x.y));
    for (int offset = 16; offset > 0; offset /= 2)
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    if (!__all_sync(0xffffffffu, finite)) {
      if (lane == 0) atomicMin(bad_block, static_cast<unsigned long long>(b));
      continue;
    }
    if (lane == 0) absmax[b] = amax;
    const float inv = __fdiv_rn(1.0f, fmaxf(amax, 1e-38f));
    const float even = fminf(fmaxf(__fmul_rn(x.x, inv), -1.0f), 1.0f);
    const float odd = fminf(fmaxf(__fmul_rn(x.y, inv), -1.0f), 1.0f);
    int hi = 0, lo = 0;
#pragma unroll
    for (int k = 0; k < 15; ++k) {
      hi += mid.at[k] < even;
      lo += mid.at[k] < odd;
    }
    codes[b * kFourBitBlock / 2 + lane] = static_cast<uint8_t>(hi << 4 | lo);
  }
}

void check_size(int64_t n, const char* what) {
  if (n % kFourBitBlock != 0)
    ::frugal::fail(what, ": ", n, " elements is not a multiple of the block size ", kFourBitBlock);
}

}  // namespace

Nf4Tables nf4_tables(const float* nf4_table, const float* absmax_map) {
  Nf4Tables tables;
  std::memcpy(tables.nf4, nf4_table, sizeof(tables.nf4));
  std::memcpy(tables.absmax_map, absmax_map, sizeof(tables.absmax_map));
  return tables;
}

void nf4_dequantize(bf16* out, const Nf4Device& w, int64_t n, cudaStream_t stream) {
  check_size(n, "cuda nf4_dequantize");
  if (n <= 0) return;
  const Nf4Tables tables = nf4_tables(w.nf4_table, w.absmax_map);
  const int64_t groups = n / kGroup;
  const unsigned blocks = grid_stride_blocks(groups, kThreads);
  if (aligned16(out))
    nf4_dequantize_kernel<true><<<blocks, kThreads, 0, stream>>>(out, w, tables, groups);
  else
    nf4_dequantize_kernel<false><<<blocks, kThreads, 0, stream>>>(out, w, tables, groups);
  CUDA_CHECK_LAUNCH();
}

void nf4_quantize_blocks(uint8_t* codes, float* absmax, const float* w, int64_t blocks,
                         const float* midpoints, int64_t* bad_block, cudaStream_t stream) {
  if (blocks <= 0) return;
  Nf4Midpoints mid;
  std::memcpy(mid.at, midpoints, sizeof(mid.at));
  const unsigned grid = grid_stride_blocks(blocks, kThreads / 32);
  static_assert(sizeof(int64_t) == sizeof(unsigned long long));
  nf4_quantize_kernel<<<grid, kThreads, 0, stream>>>(
      codes, absmax, w, blocks, mid, reinterpret_cast<unsigned long long*>(bad_block));
  CUDA_CHECK_LAUNCH();
}

void hqq_dequantize(bf16* out, const HqqDevice& w, int64_t n, cudaStream_t stream) {
  check_size(n, "cuda hqq_dequantize");
  if (n <= 0) return;
  const int64_t groups = n / kGroup;
  const unsigned blocks = grid_stride_blocks(groups, kThreads);
  if (aligned16(out))
    hqq_dequantize_kernel<true><<<blocks, kThreads, 0, stream>>>(out, w, groups);
  else
    hqq_dequantize_kernel<false><<<blocks, kThreads, 0, stream>>>(out, w, groups);
  CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::cuda
