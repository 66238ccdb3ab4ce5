// The block's MLP, y = h + down(silu(gate(n2)) * up(n2)) with n2 = rmsnorm(h), forward and
// backward, whole or over chunks of token rows. Every step of it but the weight gradients is
// per token, so a chunk of rows computes exactly the rows the whole would, and a block's
// working set holds [chunk, intermediate] tensors instead of [tokens, intermediate] ones (the
// 5632-wide temporaries that dominate a long sequence's block). The weight gradients sum over
// the chunks in turn: equal to the whole's up to fp32 rounding.
#pragma once

#include "model/fp8_linear.h"
#include "model/llama_block.h"

namespace frugal {

// Rows of the MLP computed at once for a micro-batch of `tokens` rows. `setting`
// (train.mlp_chunk_tokens) > 0 is taken as it is (at least tokens: whole); 0 chooses: whole up
// to kMlpWholeTokens, else chunks whose [rows, intermediate] tensors are at most half a
// [tokens, hidden] one (the size of what the rest of the block holds per tensor), at least
// kMlpMinChunkTokens rows (GEMMs stay efficient), a multiple of 1024.
inline constexpr int64_t kMlpWholeTokens = 16384;
inline constexpr int64_t kMlpMinChunkTokens = 8192;
int64_t mlp_chunk_rows(int64_t tokens, const LlamaConfig& config, int64_t setting);

// Whether the block's MLP runs in chunks: ctx.mlp_chunk_rows below the tokens, and no FP8
// linear in the MLP (its scales come from the whole tensor's amax).
bool mlp_in_chunks(const BlockContext& ctx, int64_t tokens);

// What a chunked forward keeps whole for the backward (the policy's choice, llama_block.cpp).
enum class MlpKept {
  nothing,      // full checkpointing, evaluation: the backward recomputes each chunk from h
  projections,  // selective: gate, up and the adapters' t
  everything,   // none: n2, rstd2, gate, up, act and the adapters' t
};

// Returns y; fills a.n2, a.rstd2, a.gate, a.up, a.act (whole) or what `kept` says (chunks).
// checksum (null: none) receives the sum of squares of act (in chunks: the chunks' sums, in
// order; RecomputeCheck compares it with the recompute's, made the same way).
Tensor mlp_forward(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx,
                   Fp8InputCasts& casts, MlpKept kept, double* checksum);
// Returns d(loss)/dh (dy included); weight gradients accumulated into g. In chunks, what the
// forward did not keep is recomputed chunk by chunk (checksum and ctx.perturb_recompute as
// block_recompute's); whole, a holds every intermediate (block_recompute made them).
Tensor mlp_backward(const Tensor& dy, const BlockActivations& a, const BlockWeights& w,
                    BlockWeights& g, const BlockContext& ctx, Fp8InputCasts& casts,
                    double* checksum);

}  // namespace frugal
