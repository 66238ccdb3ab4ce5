// Dequantization of 4-bit base weights on the GPU, one matrix at a time into a reused bf16
// buffer: NF4 with double-quantized absmax (quant/nf4.h) and HQQ (quant/hqq.h).
//
// Each thread of a grid-stride loop expands 4 code bytes into 8 values, which never straddle a
// 64-element block; with a 16-byte aligned output they go out in one 16-byte store. The tables
// (16 + 256 floats) are a __grid_constant__ kernel parameter: read from the constant bank, no
// per-device global state. The arithmetic uses __fmul_rn / __fadd_rn so that nvcc cannot fuse
// it into an FMA: the result is the CPU's fp32 value rounded to bf16, bit for bit, and does not
// depend on the grid (each output is computed by exactly one thread).
#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pack16.cuh"
#include "kernels/cuda/quant.h"

namespace frugal::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kBlockSize = 64;         // elements per absmax block / HQQ group
constexpr int64_t kAbsmaxBlockSize = 256;  // absmax values per second-level scale
using bf16 = __nv_bfloat16;

struct Nf4Tables {
  float nf4[16];
  float absmax_map[256];
};

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
__global__ void nf4_dequantize_kernel(bf16* out, const uint8_t* codes, const uint8_t* absmax_codes,
                                      const float* absmax_scales, float absmax_offset,
                                      const __grid_constant__ Nf4Tables tables, int64_t groups) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < groups;
       q += stride) {
    const int64_t first = q * kGroup;
    const int64_t b = first / kBlockSize;
    const float centered =
        __fmul_rn(tables.absmax_map[absmax_codes[b]], absmax_scales[b / kAbsmaxBlockSize]);
    const float absmax = __fadd_rn(centered, absmax_offset);
    float v[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup / 2; ++k) {
      const uint8_t byte = codes[first / 2 + k];
      v[2 * k] = __fmul_rn(tables.nf4[byte >> 4], absmax);
      v[2 * k + 1] = __fmul_rn(tables.nf4[byte & 0xF], absmax);
    }
    store_eight<kVec>(out + first, v);
  }
}

template <bool kVec>
__global__ void hqq_dequantize_kernel(bf16* out, const uint8_t* codes, const float* scales,
                                      const float* zeros, int64_t groups) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < groups;
       q += stride) {
    const int64_t first = q * kGroup;
    const int64_t g = first / kBlockSize;
    const float scale = scales[g], zero = zeros[g];
    float v[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup / 2; ++k) {
      const uint8_t byte = codes[first / 2 + k];
      v[2 * k] = __fmul_rn(__fsub_rn(static_cast<float>(byte >> 4), zero), scale);
      v[2 * k + 1] = __fmul_rn(__fsub_rn(static_cast<float>(byte & 0xF), zero), scale);
    }
    store_eight<kVec>(out + first, v);
  }
}

void check_size(int64_t n, const char* what) {
  if (n % kBlockSize != 0)
    ::frugal::fail(what, ": ", n, " elements is not a multiple of the block size ", kBlockSize);
}

}  // namespace

void nf4_dequantize(bf16* out, const uint8_t* codes, const uint8_t* absmax_codes,
                    const float* absmax_scales, float absmax_offset, const float* nf4_table,
                    const float* absmax_map, int64_t n, cudaStream_t stream) {
  check_size(n, "cuda nf4_dequantize");
  if (n <= 0) return;
  Nf4Tables tables;
  std::memcpy(tables.nf4, nf4_table, sizeof(tables.nf4));
  std::memcpy(tables.absmax_map, absmax_map, sizeof(tables.absmax_map));
  const int64_t groups = n / kGroup;
  const unsigned blocks = grid_stride_blocks(groups, kThreads);
  if (aligned16(out))
    nf4_dequantize_kernel<true><<<blocks, kThreads, 0, stream>>>(
        out, codes, absmax_codes, absmax_scales, absmax_offset, tables, groups);
  else
    nf4_dequantize_kernel<false><<<blocks, kThreads, 0, stream>>>(
        out, codes, absmax_codes, absmax_scales, absmax_offset, tables, groups);
  CUDA_CHECK_LAUNCH();
}

void hqq_dequantize(bf16* out, const uint8_t* codes, const float* scales, const float* zeros,
                    int64_t n, cudaStream_t stream) {
  check_size(n, "cuda hqq_dequantize");
  if (n <= 0) return;
  const int64_t groups = n / kGroup;
  const unsigned blocks = grid_stride_blocks(groups, kThreads);
  if (aligned16(out))
    hqq_dequantize_kernel<true><<<blocks, kThreads, 0, stream>>>(out, codes, scales, zeros, groups);
  else
    hqq_dequantize_kernel<false>
        <<<blocks, kThreads, 0, stream>>>(out, codes, scales, zeros, groups);
  CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::cuda
