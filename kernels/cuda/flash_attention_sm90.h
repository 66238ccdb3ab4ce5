// Causal GQA attention on Hopper's tensor cores (sm_90a), FlashAttention-3 style, head dims 64
// and 128: wgmma, TMA tile loads, one producer and two consumer warpgroups per block.
// Same contract as flash_attention.h; attention.h's launchers take it on a compute capability
// 9.0 device unless their caller says no (allow_sm90 = false: FRUGAL_ATTENTION_SM90=0, read by
// the app at start-up), which sends them to the FlashAttention-2 kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/cpu/attention.h"

namespace frugal::cuda {

// Whether they take this call (measured 1.7x the FlashAttention-2 kernels forward + backward on
// an H200, doc/benchmarks.md, so the launchers prefer them): the build has the sm_90a kernels, the
// current device has compute capability 9.0, head dim 64 or 128, bf16 tensors 16-byte aligned (TMA
// needs it), fp32 gradients 8-byte aligned (null pointers are ignored), lengths that fit an int.
bool flash_attention_sm90_supports(const ::frugal::cpu::AttentionShape& s,
                                   std::initializer_list<const void*> bf16_tensors,
                                   std::initializer_list<const void*> fp32_tensors);

// Same contract as attention_forward (attention.h); the call must be supported.
void flash_attention_sm90_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                                  const __nv_bfloat16* k, const __nv_bfloat16* v,
                                  const ::frugal::cpu::AttentionShape& s, cudaStream_t stream);

// The blocks of the forward's tail for shape s on the current device: persistent blocks walk
// each sequence's longer query blocks and, where a simulation of the walk says it ends sooner,
// a second grid of a block per item takes the shortest (0: no tail). For tests and benchmarks.
int64_t flash_attention_sm90_forward_tail_blocks(const ::frugal::cpu::AttentionShape& s);

// How the backward sums dQ. kFused: the dK/dV pass adds each key block's part of dQ (dS K)
// into dq itself, the blocks of one query tile taking turns in a fixed order (5 products per
// pair of tiles). kSeparateKernel: a second kernel per query block recomputes S and dP (7).
// kAuto: fused where that was measured faster, head_dim 128 without GQA, and dq 16-byte aligned
// (the copy engine's adds need it; kFused insists); otherwise the second kernel.
enum class Sm90DqSum { kAuto, kFused, kSeparateKernel };

// Same contract as attention_backward (attention.h): dq, dk, dv accumulated, deterministic (the
// same bits run to run for either way of summing dQ; dk and dv do not depend on it); scratch holds
// flash_attention_backward_scratch_floats(s) floats. The call must be supported.
void flash_attention_sm90_backward(float* dq, float* dk, float* dv, const __nv_bfloat16* dout,
                                   const __nv_bfloat16* q, const __nv_bfloat16* k,
                                   const __nv_bfloat16* v, const __nv_bfloat16* out,
                                   const float* lse, const ::frugal::cpu::AttentionShape& s,
                                   float* scratch, cudaStream_t stream,
                                   Sm90DqSum dq_sum = Sm90DqSum::kAuto);
// The same gradients written once as bf16 (dq, dk, dv overwritten, 16-byte aligned: the call
// makes them whole, so nothing needs zeroing before or converting after), dQ by the second kernel
// (kFused is refused). Faster than zeroed fp32 gradients with dQ fused, then converted, at
// every shape measured since the written gradients leave through TMA stores (H200, 2026-12-03:
// 4096 tokens at head dim 128 4.00-4.23 against 4.40 ms forward + backward, 16384 tokens 15.7
// against 16.4, before the conversions).
void flash_attention_sm90_backward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                                   const __nv_bfloat16* dout, const __nv_bfloat16* q,
                                   const __nv_bfloat16* k, const __nv_bfloat16* v,
                                   const __nv_bfloat16* out, const float* lse,
                                   const ::frugal::cpu::AttentionShape& s, float* scratch,
                                   cudaStream_t stream, Sm90DqSum dq_sum = Sm90DqSum::kAuto);

}  // namespace frugal::cuda
