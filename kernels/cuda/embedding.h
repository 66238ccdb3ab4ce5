// Token embedding lookup on the GPU and its backward (a deterministic scatter-add into the
// table's fp32 gradient).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace frugal::cuda {

// out[t, :] = table[tokens[t], :] (bf16). tokens is a device array; ids outside [0, vocab)
// cannot throw from the GPU: their rows of out are zero (the data loader checks ids on the host
// before they get here).
void embedding_forward(__nv_bfloat16* out, const int32_t* tokens, const __nv_bfloat16* table,
                       int64_t n_tokens, int64_t vocab, int64_t dim, cudaStream_t stream);

// int32 entries of scratch that embedding_backward needs.
int64_t embedding_backward_scratch_ints(int64_t n_tokens, int64_t vocab);

// dtable[tokens[t], :] += dout[t, :] (fp32 table gradient, accumulated). Deterministic and in the
// CPU kernel's order: each element adds its tokens in order t = 0, 1, ..., so the result equals
// frugal::cpu::embedding_backward's bit for bit on the same inputs. Ids outside [0, vocab) are
// skipped. scratch: embedding_backward_scratch_ints(n_tokens, vocab) int32 of device memory,
// 256-byte aligned.
void embedding_backward(float* dtable, const __nv_bfloat16* dout, const int32_t* tokens,
                        int64_t n_tokens, int64_t vocab, int64_t dim, int32_t* scratch,
                        cudaStream_t stream);

}  // namespace frugal::cuda
