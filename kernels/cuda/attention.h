// Causal (optionally sliding-window: AttentionShape::window; optionally packed-document:
// AttentionShape::documents) attention with grouped-query heads on the GPU (bf16 in and out, fp32
// math): a fused forward returning the per-row log-sum-exp and a deterministic backward
// recomputing P. Head dims 64 and 128 run on the tensor cores (flash_attention.h); others (16,
// 32) on simple kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/cpu/attention.h"

namespace frugal::cuda {

// Same fields and meaning as the CPU kernel's (batch, q_len, kv_len, n_heads, n_kv_heads,
// head_dim, scale, causal_offset, window, documents): query row i sees key j iff j <= i +
// causal_offset and, with window > 0, i + causal_offset - j < window, and with documents
// (cpu::DocumentMask, its arrays in device memory) j is in row i's document.
using AttentionShape = ::frugal::cpu::AttentionShape;

// Whether the kernels are compiled for this head dim (16, 32, 64 and 128); the launchers
// throw frugal::Error for others.
bool attention_supports_head_dim(int64_t head_dim);

// q: [batch, q_len, n_heads, head_dim]; k, v: [batch, kv_len, n_kv_heads, head_dim] (bf16)
// out: [batch, q_len, n_heads, head_dim] (bf16, overwritten); lse: [batch, n_heads, q_len]
// (fp32, overwritten). A row that sees no key gets out = 0 and lse = -inf.
// allow_sm90: on a compute capability 9.0 GPU, the Hopper kernels (flash_attention_sm90.h) take
// the shapes they support; false keeps the FlashAttention-2 ones (to compare them, or to rule a
// kernel out). The caller decides: kernels read no environment.
void attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                       const __nv_bfloat16* k, const __nv_bfloat16* v, const AttentionShape& s,
                       bool allow_sm90, cudaStream_t stream);

// Floats of device scratch attention_backward needs for this shape (2 per query row and head,
// and one per 64-row query tile and head).
int64_t attention_backward_scratch_floats(const AttentionShape& s);

// dq, dk, dv (fp32, shaped like q, k, v) are ACCUMULATED (+=) so the blocks of a ring add into
// the same buffers: zero them first. out and lse are the forward's (for a ring: the MERGED ones
// of the whole row, as for the CPU kernel). scratch: attention_backward_scratch_floats(s)
// floats of device memory, overwritten (free again when the stream reaches the end of the
// call). Deterministic: every gradient element is summed in a fixed order (by one thread, or
// on Hopper, dq by the key blocks taking turns), no unordered float atomics; the same inputs
// give the same bits. allow_sm90 as for attention_forward.
void attention_backward(float* dq, float* dk, float* dv, const __nv_bfloat16* dout,
                        const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                        const __nv_bfloat16* out, const float* lse, const AttentionShape& s,
                        float* scratch, bool allow_sm90, cudaStream_t stream);

// Whether attention_backward should write this call's gradients once as bf16 instead: wherever the
// Hopper kernels take it, writing is the faster way (flash_attention_sm90.h).
// bf16_tensors: those at hand of dout, q, k, v, out, dq, dk, dv (the alignment TMA needs).
bool attention_backward_writes_bf16(const AttentionShape& s,
                                    std::initializer_list<const void*> bf16_tensors,
                                    bool allow_sm90);
// The same gradients written as bf16, dq, dk, dv OVERWRITTEN: one call makes them whole (no ring),
// so there is nothing to zero before nor an fp32 copy to convert after. Needs the Hopper kernels
// (throws otherwise); attention_backward_writes_bf16 says where it runs.
void attention_backward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                        const __nv_bfloat16* dout, const __nv_bfloat16* q, const __nv_bfloat16* k,
                        const __nv_bfloat16* v, const __nv_bfloat16* out, const float* lse,
                        const AttentionShape& s, float* scratch, bool allow_sm90,
                        cudaStream_t stream);

}  // namespace frugal::cuda
