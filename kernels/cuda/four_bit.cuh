// The arithmetic of the 4-bit formats on eight consecutive values, shared by the kernels that
// read 4-bit weights: the dequantization into bf16 (quant.cu) and the FP8 casts straight from
// the codes (fp8.cu). One definition, so both give the same bits: each value is the CPU's fp32
// (__fmul_rn / __fadd_rn / __fsub_rn: nvcc may not fuse them into an FMA), as quant.cu explains.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/quant.h"

namespace frugal::cuda {

inline constexpr int64_t kFourBitBlock = 64;     // elements per NF4 absmax block / HQQ group
inline constexpr int64_t kNf4AbsmaxGroup = 256;  // absmax values per second-level scale
inline constexpr int kFourBitGroup = 8;          // values per call below (4 code bytes)

// NF4's two tables, passed by value as a __grid_constant__ kernel parameter (the constant bank).
struct Nf4Tables {
  float nf4[16];
  float absmax_map[256];
};
Nf4Tables nf4_tables(const float* nf4_table, const float* absmax_map);  // host arrays

// v[0..7] = values first .. first + 7 in fp32 (first a multiple of 8, so all in one block).
__device__ __forceinline__ void nf4_eight(float* v, const Nf4Device& w, const Nf4Tables& tables,
                                          int64_t first) {
  const int64_t b = first / kFourBitBlock;
  const float centered =
      __fmul_rn(tables.absmax_map[w.absmax_codes[b]], w.absmax_scales[b / kNf4AbsmaxGroup]);
  const float absmax = __fadd_rn(centered, w.absmax_offset);
#pragma unroll
  for (int k = 0; k < kFourBitGroup / 2; ++k) {
    const uint8_t byte = w.codes[first / 2 + k];
    v[2 * k] = __fmul_rn(tables.nf4[byte >> 4], absmax);
    v[2 * k + 1] = __fmul_rn(tables.nf4[byte & 0xF], absmax);
  }
}

__device__ __forceinline__ void hqq_eight(float* v, const HqqDevice& w, int64_t first) {
  const int64_t g = first / kFourBitBlock;
  const float scale = w.scales[g], zero = w.zeros[g];
#pragma unroll
  for (int k = 0; k < kFourBitGroup / 2; ++k) {
    const uint8_t byte = w.codes[first / 2 + k];
    v[2 * k] = __fmul_rn(__fsub_rn(static_cast<float>(byte >> 4), zero), scale);
    v[2 * k + 1] = __fmul_rn(__fsub_rn(static_cast<float>(byte & 0xF), zero), scale);
  }
}

}  // namespace frugal::cuda
