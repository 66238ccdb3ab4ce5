// Causal GQA attention on the tensor cores, FlashAttention-2 style, for head dims 64 and 128:
// the fast path behind attention.h's launchers (which fall back to the simple kernels otherwise).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/cpu/attention.h"

namespace frugal::cuda {

// Whether the tensor-core kernels take this shape and these pointers: head dim 64 or 128,
// bf16 tensors 16-byte aligned, fp32 gradients 8-byte aligned (null pointers are ignored).
bool flash_attention_supports(const ::frugal::cpu::AttentionShape& s,
                              std::initializer_list<const void*> bf16_tensors,
                              std::initializer_list<const void*> fp32_tensors);

// Same contract as attention_forward (attention.h); the shape must be supported.
void flash_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                             const __nv_bfloat16* k, const __nv_bfloat16* v,
                             const ::frugal::cpu::AttentionShape& s, cudaStream_t stream);

// Tile sizes of the backward: kLargeSmem needs about 130 KiB of shared memory per block
// (sm_80, sm_90), kSmallSmem fits the 99 KiB of sm_86/sm_89/sm_120; kAuto asks the device.
enum class FlashBackwardTiles { kAuto, kLargeSmem, kSmallSmem };

// Rows of a query tile of the sm90 backward's fused dQ, which keeps one turn counter per tile and
// query head in the scratch.
inline constexpr int64_t kFlashDqTileRows = 64;

// The sm90 backward's fused-dQ turn counters (int32): one per kFlashDqTileRows-row query tile and
// query head.
inline int64_t flash_attention_dq_turn_count(const ::frugal::cpu::AttentionShape& s) {
  return s.batch * s.n_heads * ((s.q_len + kFlashDqTileRows - 1) / kFlashDqTileRows);
}

// Floats of scratch the backward needs: lse * log2(e) and Delta = rowsum(dout * out), per row;
// then (used by the sm90 kernels only) flash_attention_dq_turn_count(s) turn counters.
int64_t flash_attention_backward_scratch_floats(const ::frugal::cpu::AttentionShape& s);

// The backward's first pass, shared with flash_attention_sm90.h: per query row, lse * log2(e)
// (+inf for a row that sees no key, so that exp2(s - it) = 0) into scratch[0, rows) and
// Delta = rowsum(dout * out) into scratch[rows, 2 rows), both [batch, n_heads, q_len] with
// rows = batch * n_heads * q_len.
void flash_attention_backward_prepare(float* scratch, const __nv_bfloat16* dout,
                                      const __nv_bfloat16* out, const float* lse,
                                      const ::frugal::cpu::AttentionShape& s, cudaStream_t stream);

// Same contract as attention_backward (attention.h); the shape must be supported.
void flash_attention_backward(float* dq, float* dk, float* dv, const __nv_bfloat16* dout,
                              const __nv_bfloat16* q, const __nv_bfloat16* k,
                              const __nv_bfloat16* v, const __nv_bfloat16* out, const float* lse,
                              const ::frugal::cpu::AttentionShape& s, float* scratch,
                              cudaStream_t stream,
                              FlashBackwardTiles tiles = FlashBackwardTiles::kAuto);

}  // namespace frugal::cuda
