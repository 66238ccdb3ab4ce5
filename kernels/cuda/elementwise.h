// Small elementwise helpers the model needs between the big kernels, on the GPU: in bf16 for
// activations (residual adds), in fp32 for gradient buffers (accumulation, clipping).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// y += x  (bf16: computed in fp32, rounded once; x may alias y)
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);
void add_inplace(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n, cudaStream_t stream);
// y += x with y bf16 and x fp32 (a bf16 run's gradient shards receiving fp32 sums): the sum in
// fp32, rounded once.
void add_inplace(__nv_bfloat16* y, const float* x, int64_t n, cudaStream_t stream);
// y *= s
void scale_inplace(float* y, float s, int64_t n, cudaStream_t stream);
void scale_inplace(__nv_bfloat16* y, float s, int64_t n, cudaStream_t stream);
// y += s * x
// Inverted dropout, as frugal::cpu::dropout (the same mask: kernels/dropout_mask.h); y may
// alias x. bf16: computed in fp32, rounded once. x[0] is element `first` of the mask.
void dropout(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n, float p, uint64_t seed,
             int64_t first, cudaStream_t stream);
void add_scaled_inplace(float* y, const float* x, float s, int64_t n, cudaStream_t stream);
void add_scaled_inplace(__nv_bfloat16* y, const __nv_bfloat16* x, float s, int64_t n,
                        cudaStream_t stream);

}  // namespace frugal::cuda
