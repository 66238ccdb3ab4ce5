// SwiGLU's gate on the GPU: h = silu(g) * u, silu(g) = g * sigmoid(g), elementwise; bf16 in and
// out, fp32 math.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// h[i] = silu(g[i]) * u[i]; h may alias g or u.
void swiglu_forward(__nv_bfloat16* h, const __nv_bfloat16* g, const __nv_bfloat16* u, int64_t n,
                    cudaStream_t stream);
// dg, du overwritten (each may alias dh, g or u: every element is read before it is written).
void swiglu_backward(__nv_bfloat16* dg, __nv_bfloat16* du, const __nv_bfloat16* dh,
                     const __nv_bfloat16* g, const __nv_bfloat16* u, int64_t n,
                     cudaStream_t stream);

}  // namespace frugal::cuda
