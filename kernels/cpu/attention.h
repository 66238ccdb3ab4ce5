// Causal scaled-dot-product attention with grouped-query heads, returning the per-row
// log-sum-exp so that partial results can be merged (ring attention) and the backward can
// recompute the probabilities without storing them.
#pragma once
#include <cstdint>

namespace frugal::cpu {

struct AttentionShape {
  int64_t batch = 1;
  int64_t q_len = 0;       // query rows per sequence
  int64_t kv_len = 0;      // key/value rows per sequence
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads; n_heads % n_kv_heads == 0, query head h reads
                           // kv head h / (n_heads / n_kv_heads)
  int64_t head_dim = 0;
  float scale = 0;  // usually 1/sqrt(head_dim)
  // Query row i may see key row j iff j <= i + causal_offset. 0 with q_len == kv_len is
  // ordinary causal attention; ring attention passes the distance between the blocks'
  // first positions. A row that sees no key gets out = 0 and lse = -inf.
  int64_t causal_offset = 0;
};

// q: [batch, q_len, n_heads, head_dim]; k, v: [batch, kv_len, n_kv_heads, head_dim]
// out: [batch, q_len, n_heads, head_dim] (overwritten); lse: [batch, n_heads, q_len]
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& s);
// Gradients from dout, recomputing the probabilities from q, k and lse. dq, dk, dv are
// ACCUMULATED (+=), so blocks of a ring add into the same buffers: zero them first.
// `out` is the forward output (for the row sums D = rowsum(dout * out)). For a ring, pass
// every block the MERGED out and lse of the whole row (not the block's own), so that the
// recomputed probabilities are those of the full softmax; rows that see no key of this block
// (or none at all) contribute nothing.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& s);

}  // namespace frugal::cpu
