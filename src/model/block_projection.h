// A block's projections, y = x W^T (+ bias) (+ its LoRA adapter's update), forward and backward,
// in the compute dtype or through FP8: what the attention half (llama_block.cpp) and the MLP
// (llama_mlp.cpp) are written with.
#pragma once

#include "model/fp8_linear.h"
#include "model/llama_block.h"

namespace frugal {

// y = x W^T, plus t B^T where the projection has a LoRA adapter, t = s d(x) A^T (d: its
// dropout, s = alpha / r), kept in a.lora_t[p]; plus residual when it is defined (the residual
// stream's add, in the GEMM where it can be). x may be a chunk of the micro-batch's rows,
// starting at ctx.first_row (the dropout mask follows the rows).
Tensor project(const Tensor& x, const BlockWeights& w, int p, const BlockContext& ctx,
               BlockActivations& a, Fp8InputCasts& casts, const Tensor& residual = Tensor());
// The adapter's t = s d(x) A^T alone (a recompute that needs t but not y).
Tensor adapter_t(const Tensor& x, const BlockWeights& w, int p, const BlockContext& ctx);
// The backward of project: returns dx; dW (when not frozen), dA and dB accumulated. With dx_sum
// (the gradient of the same x from another projection), dx is added into *dx_sum, which is
// returned: the projections that share an input sum their gradients without separate adds.
Tensor project_backward(const Tensor& dy, const Tensor& x, const BlockWeights& w, BlockWeights& g,
                        int p, const BlockContext& ctx, const BlockActivations& a,
                        Fp8InputCasts& casts, Tensor* dx_sum = nullptr);

}  // namespace frugal
