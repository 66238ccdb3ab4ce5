// Rotary position embedding on the GPU in Hugging Face's rotate-half convention: for head-dim d,
// pair element i with i + d/2, angle = pos * inv_freq[i] (the table the caller gives: plain or
// scaled for long context); bf16 tensors, fp32 math.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// The largest head_dim / 2 the kernel takes: the table travels as a kernel argument.
constexpr int64_t kMaxRopePairs = 256;

// y = x rotated by the angle of positions[t] (device array of tokens int32), both [tokens, heads,
// head_dim] bf16; y may be x (in place), otherwise the two must not overlap. The angle is rounded
// exactly as frugal::cpu::rope_forward rounds it (and as transformers does): angle = float(pos) *
// inv_freq[i] in fp32, cos/sin of that float angle, times attention_scaling in fp32. inv_freq:
// head_dim / 2 floats in HOST memory (copied into the launch's arguments). head_dim must be even
// and at most 2 * kMaxRopePairs (checked, throws Error).
void rope_forward(__nv_bfloat16* y, const __nv_bfloat16* x, const int32_t* positions,
                  int64_t tokens, int64_t heads, int64_t head_dim, const float* inv_freq,
                  float attention_scaling, cudaStream_t stream);
// The backward of a scaled rotation s R is s R^T: dx = dy rotated by -angle, times s (dx may
// be dy).
void rope_backward(__nv_bfloat16* dx, const __nv_bfloat16* dy, const int32_t* positions,
                   int64_t tokens, int64_t heads, int64_t head_dim, const float* inv_freq,
                   float attention_scaling, cudaStream_t stream);

}  // namespace frugal::cuda
