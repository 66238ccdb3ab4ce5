// FP8 casts on the GPU, the twins of kernels/cpu/fp8.h: one pass over a bf16 matrix that writes
// its E4M3 or E5M2 codes (plain and/or transposed), raises the tensor's amax and counts the
// values that flush to zero or saturate; the amax pass of current scaling; delayed scaling's
// step-end update of every tensor's scale.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/fp8.h"
#include "kernels/cuda/quant.h"

namespace frugal::cuda {

using cpu::Fp8Format;

// Where a cast reads its scale and leaves what it saw (all device pointers).
struct Fp8CastState {
  float* scale;               // read; with current scaling, written (from *current_amax)
  float* scale_inv;           // written with current scaling
  float* amax;                // raised to max |x| (bit pattern order: a NaN wins); null: not kept
  const float* current_amax;  // non-null: current scaling, scale = fp8_scale_from_amax(*it, ...)
  int64_t* counts;            // [3]: values, flushed, saturated (added to)
  int margin;
};

// x bf16 [rows, cols] -> out [rows, cols] and/or out_t [cols, rows] (either may be null) with
// codes of x * scale. rows and cols multiples of 16; pointers 16-byte aligned.
void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* x, int64_t rows,
                        int64_t cols, Fp8Format format, const Fp8CastState& state,
                        cudaStream_t stream);
// The cast of a 4-bit weight [rows, cols] (row-major, n = rows * cols a multiple of 64), read
// from its codes: the codes, amax and counts that fp8_cast_transpose gives of nf4_dequantize's
// (hqq_dequantize's) bf16 output, bit for bit, without that matrix: QLoRA's frozen base straight
// into an FP8 GEMM.
void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, const Nf4Device& w, int64_t rows,
                        int64_t cols, Fp8Format format, const Fp8CastState& state,
                        cudaStream_t stream);
void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, const HqqDevice& w, int64_t rows,
                        int64_t cols, Fp8Format format, const Fp8CastState& state,
                        cudaStream_t stream);
// *amax = max |x| over n elements (n a multiple of 8, x 16-byte aligned); NaN wins.
void fp8_amax(float* amax, const __nv_bfloat16* x, int64_t n, cudaStream_t stream);
// The same of a 4-bit weight's bf16 dequantization, from its codes (n a multiple of 64).
void fp8_amax(float* amax, const Nf4Device& w, int64_t n, cudaStream_t stream);
void fp8_amax(float* amax, const HqqDevice& w, int64_t n, cudaStream_t stream);
// out[i] = bf16(decode(codes[i]) * *scale_inv): an FP8-gathered weight in the compute dtype.
void fp8_dequantize(__nv_bfloat16* out, const uint8_t* codes, int64_t n, Fp8Format format,
                    const float* scale_inv, cudaStream_t stream);
// out [cols, rows] = the transpose of the codes in [rows, cols] (cpu::fp8_transpose_codes): the
// dgrad operand of a weight gathered as FP8. Any sizes.
void fp8_transpose_codes(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols,
                         cudaStream_t stream);
// cpu::fp8_delayed_update on device arrays.
void fp8_delayed_update(float* history, float* scale, float* scale_inv, const float* max_values,
                        int64_t history_len, int64_t slots, int margin, cudaStream_t stream);

}  // namespace frugal::cuda
