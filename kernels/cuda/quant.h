// Dequantization of 4-bit base weights on the GPU, one matrix at a time into a reused bf16
// buffer: NF4 with double-quantized absmax (quant/nf4.h) and HQQ (quant/hqq.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// An NF4 weight of n values in device memory: codes n / 2 bytes (high nibble first),
// absmax_codes n / 64, absmax_scales ceil(n / 64 / 256), and the two tables as host arrays,
// frugal::nf4_values() (16) and frugal::dynamic_map_values() (256): the kernels layer sits below
// quant/, so the caller hands them over; they travel as kernel parameters.
struct Nf4Device {
  const uint8_t* codes = nullptr;
  const uint8_t* absmax_codes = nullptr;
  const float* absmax_scales = nullptr;
  float absmax_offset = 0;
  const float* nf4_table = nullptr;   // host
  const float* absmax_map = nullptr;  // host
};

// An HQQ 4-bit weight of n values in device memory: codes n / 2 bytes (high nibble first),
// scales and zeros one per group of 64.
struct HqqDevice {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  const float* zeros = nullptr;
};

// out[n] = bf16(nf4[code] * (dynamic_map[absmax_code] * absmax_scale + absmax_offset)), the CPU's
// nf4_dequantize rounded to bf16 (bit for bit). n is a multiple of 64.
void nf4_dequantize(__nv_bfloat16* out, const Nf4Device& w, int64_t n, cudaStream_t stream);

// NF4's first level on the GPU, as frugal::cpu::nf4_quantize_blocks (kernels/cpu/quant.h) bit
// for bit: codes[blocks * 32], absmax[blocks] of w[blocks * 64], one warp per block. midpoints:
// the 15 fp32 thresholds (a host array, quant/nf4.h's nf4_midpoints(); a kernel parameter).
// *bad_block (device) is lowered to the first block holding inf or NaN; set it to `blocks`
// before the launch.
void nf4_quantize_blocks(uint8_t* codes, float* absmax, const float* w, int64_t blocks,
                         const float* midpoints, int64_t* bad_block, cudaStream_t stream);

// out[n] = bf16((code - zeros[g]) * scales[g]), g = i / 64, as the CPU's hqq_dequantize rounded
// to bf16 (bit for bit). n is a multiple of 64.
void hqq_dequantize(__nv_bfloat16* out, const HqqDevice& w, int64_t n, cudaStream_t stream);

}  // namespace frugal::cuda
