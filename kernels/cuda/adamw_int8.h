// 8-bit AdamW on the GPU (optim.state_dtype = int8): the fused kernels of kernels/cpu/
// adamw_int8.h's twin, one thread block per block of state (dequantize, update, requantize in
// one pass), bit for bit the CPU twin's results (kernels/blockwise_int8.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/adamw_int8.h"

namespace frugal::cuda {

using Int8Layout = frugal::cpu::Int8Layout;  // blocks of up to kMaxInt8Block values in a row
using Int8Moment = frugal::cpu::Int8Moment;  // device pointers here
inline constexpr int64_t kMaxInt8Block = 2048;

void adamw_int8_update(float* param, const float* grad, Int8Moment m, Int8Moment v,
                       const Int8Layout& layout, const frugal::cpu::AdamWStep& s,
                       __nv_bfloat16* param_bf16, cudaStream_t stream);
void adamw_int8_update(__nv_bfloat16* param, const __nv_bfloat16* grad, Int8Moment m, Int8Moment v,
                       const Int8Layout& layout, const frugal::cpu::AdamWStep& s,
                       const Bf16Store& store, cudaStream_t stream);
void galore_moments_int8(Int8Moment m, Int8Moment v, float* r, const Int8Layout& layout,
                         float beta1, float beta2, float eps, cudaStream_t stream);
void quantize_blockwise(Int8Moment q, const float* x, const Int8Layout& layout, bool is_signed,
                        cudaStream_t stream);
void dequantize_blockwise(float* x, Int8Moment q, const Int8Layout& layout, bool is_signed,
                          cudaStream_t stream);

}  // namespace frugal::cuda
