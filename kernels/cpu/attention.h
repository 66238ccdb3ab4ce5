// Causal (optionally sliding-window) scaled-dot-product attention with grouped-query heads,
// returning the per-row log-sum-exp so that partial results can be merged (ring attention) and
// the backward can recompute the probabilities without storing them.
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
  // Sliding window (Mistral): > 0 also hides key j from row i unless
  // (i + causal_offset) - j < window, i.e. a query sees itself and the window - 1 keys before
  // it, as transformers' sliding_window_overlay (kv_idx > q_idx - sliding_window). 0: none.
  int64_t window = 0;
};

// The keys query row i sees: [first, end), empty when first >= end.
struct VisibleKeys {
  int64_t first = 0, end = 0;
};
inline VisibleKeys visible_keys(int64_t i, const AttentionShape& s) {
  const int64_t last = i + s.causal_offset;  // the query's position among the keys
  auto clamp = [&](int64_t x) { return x < 0 ? 0 : (x > s.kv_len ? s.kv_len : x); };
  return {s.window > 0 ? clamp(last - s.window + 1) : 0, clamp(last + 1)};
}

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
