// bf16 <-> fp32 conversion on the GPU: master weights (fp32) to the bf16 copies the forward
// reads, and bf16 tensors widened for fp32 accumulation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// out[i] = float(in[i]) (exact).
void bf16_to_f32(float* out, const __nv_bfloat16* in, int64_t n, cudaStream_t stream);
// out[i] = bf16(in[i]), rounded to nearest even as frugal::float_to_bf16 does.
void f32_to_bf16(__nv_bfloat16* out, const float* in, int64_t n, cudaStream_t stream);

}  // namespace frugal::cuda
