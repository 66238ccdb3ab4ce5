// RMSNorm on the GPU as Llama uses it: y = x / sqrt(mean(x^2) + eps) * w; bf16 activations and
// weights, fp32 statistics and math, fp32 weight gradient.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// y[r, :] = x[r, :] * rstd[r] * w;  rstd[r] = 1 / sqrt(mean_j x[r, j]^2 + eps) is saved for the
// backward (rstd may be null when not needed).
void rmsnorm_forward(__nv_bfloat16* y, float* rstd, const __nv_bfloat16* x, const __nv_bfloat16* w,
                     int64_t rows, int64_t dim, float eps, cudaStream_t stream);

// The residual add that precedes each norm, fused with it: s = x + r (rounded to bf16 and
// written out: it is the next residual stream and what the backward needs), then y and rstd
// as rmsnorm_forward computes them from the rounded s. s may alias x or r.
void rmsnorm_residual_forward(__nv_bfloat16* s, __nv_bfloat16* y, float* rstd,
                              const __nv_bfloat16* x, const __nv_bfloat16* r,
                              const __nv_bfloat16* w, int64_t rows, int64_t dim, float eps,
                              cudaStream_t stream);

// Floats of scratch that rmsnorm_backward needs for dw (the per-block partial sums).
int64_t rmsnorm_backward_scratch_floats(int64_t rows, int64_t dim);

// dx[r, :] overwritten, plus dresidual[r, :] when it is not null (the gradient that reaches the
// same tensor through the residual path, so the caller needs no separate add; it may alias dx).
// dw (fp32, dim) is accumulated, deterministically, when not null (overwritten without
// accumulate): then dw_scratch must hold rmsnorm_backward_scratch_floats(rows, dim) floats. x
// and rstd are what the forward saw and saved (for the fused forward, x is s).
void rmsnorm_backward(__nv_bfloat16* dx, float* dw, const __nv_bfloat16* dy, const __nv_bfloat16* x,
                      const __nv_bfloat16* w, const float* rstd, const __nv_bfloat16* dresidual,
                      int64_t rows, int64_t dim, float* dw_scratch, cudaStream_t stream,
                      bool accumulate = true);
// The same with a bf16 dw (not null), each element rounded once after its fp32 add: the
// gradient shards of a bf16 run take the sum directly.
void rmsnorm_backward(__nv_bfloat16* dx, __nv_bfloat16* dw, const __nv_bfloat16* dy,
                      const __nv_bfloat16* x, const __nv_bfloat16* w, const float* rstd,
                      const __nv_bfloat16* dresidual, int64_t rows, int64_t dim, float* dw_scratch,
                      cudaStream_t stream, bool accumulate = true);

}  // namespace frugal::cuda
