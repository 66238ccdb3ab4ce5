// Rotary position embedding on the GPU in Hugging Face's rotate-half convention: for head-dim d,
// pair element i with i + d/2, angle = pos * theta^(-2i/d); bf16 tensors, fp32 math.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// x: [tokens, heads, head_dim] bf16, rotated in place by the angle of positions[t] (device
// array of tokens int32). The angle is rounded exactly as frugal::cpu::rope_forward rounds it
// (and as transformers does): inv_freq = float(1 / theta^(2i/d)), angle = float(pos) * inv_freq
// in fp32, cos/sin of that float angle. head_dim must be even (checked, throws Error).
void rope_forward(__nv_bfloat16* x, const int32_t* positions, int64_t tokens, int64_t heads,
                  int64_t head_dim, float theta, cudaStream_t stream);
// The backward of a rotation is the inverse rotation: dx rotated in place by -angle.
void rope_backward(__nv_bfloat16* dx, const int32_t* positions, int64_t tokens, int64_t heads,
                   int64_t head_dim, float theta, cudaStream_t stream);

}  // namespace frugal::cuda
