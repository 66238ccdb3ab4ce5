// Folding a partial attention result into a running one by their log-sum-exps, on the GPU:
// what ring attention does after each block pair (the CPU twin is in ops/attention_offset.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// out [batch * T, H, D] fp32 and lse [batch, H, T] fp32 (the running result, updated in place),
// part_out [batch * T, H, D] bf16 and part_lse [batch, H, T] fp32 (one block's). Per row:
// lse' = log(exp(lse) + exp(part_lse)), out' = exp(lse - lse') out + exp(part_lse - lse') part.
// A row with part_lse = -inf (it saw no key of the block) is left as it is; a row with
// lse = -inf takes the part as it is.
void merge_attention(float* out, float* lse, const __nv_bfloat16* part_out, const float* part_lse,
                     int64_t batch, int64_t T, int64_t H, int64_t D, cudaStream_t stream);

}  // namespace frugal::cuda
