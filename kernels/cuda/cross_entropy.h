// Cross-entropy of a chunk of logit rows against int32 target ids on the GPU (target < 0 is
// masked), with the gradient written in the same kernel, so callers can go chunk by chunk.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// Per row r of logits [rows, vocab]: row_loss[r] (fp32, overwritten) = logsumexp(logits[r]) -
// logits[r][targets[r]], or 0 when targets[r] < 0. *loss_sum (one fp32, ACCUMULATED: +=) gets
// the sum of row_loss in a fixed order, so successive chunks on one stream add up
// deterministically. When dlogits is not null it is overwritten with
// grad_scale * (softmax(logits[r]) - onehot(targets[r])), 0 for masked rows.
// A target >= vocab is recorded in error_info (2 device int32: row + 1, then the id; zero it
// once after allocating) and the row treated as masked; with check = true the launcher then
// synchronizes the stream and throws frugal::Error naming the row and id. With check = false,
// call cross_entropy_check once after the last chunk instead (one synchronization per step).
void cross_entropy(float* loss_sum, float* row_loss, __nv_bfloat16* dlogits,
                   const __nv_bfloat16* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                   float grad_scale, int32_t* error_info, cudaStream_t stream, bool check = true);
void cross_entropy(float* loss_sum, float* row_loss, __nv_bfloat16* dlogits, const float* logits,
                   const int32_t* targets, int64_t rows, int64_t vocab, float grad_scale,
                   int32_t* error_info, cudaStream_t stream, bool check = true);

// Synchronizes `stream`; throws frugal::Error if a kernel recorded an out-of-range target in
// error_info (which is then reset to zero, so the buffer can be reused).
void cross_entropy_check(int32_t* error_info, int64_t vocab, cudaStream_t stream);

}  // namespace frugal::cuda
