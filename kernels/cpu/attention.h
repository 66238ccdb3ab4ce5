// Causal (optionally sliding-window, optionally document-masked) scaled-dot-product attention
// with grouped-query heads, returning the per-row log-sum-exp so that partial results can be
// merged (ring attention) and the backward can recompute the probabilities without storing them.
#pragma once
#include <cstdint>

namespace frugal::cpu {

// Packed documents (data.packing = documents): a sequence holds several documents back to back
// and a query sees only keys of its own document. Both arrays are in POSITIONS of the whole
// sequence (0 = its first token), so that the blocks of a ring, which hold pieces of one sequence,
// use the same numbers; the call's rows are placed in it by key_position0 (key row j is at
// key_position0 + j, query row i at key_position0 + causal_offset + i). Documents are contiguous,
// so both arrays are non-decreasing along each sequence's rows, and consistent with each other:
// a query at position p sees a key at position k <= p iff query_doc_start[i] <= k, equivalently
// p < key_doc_end[j]. Kernels use the first for rows and the second to find the rows of a block
// of keys; a tile of which no element is visible is skipped, not masked. The arrays live where
// the kernel runs (host for the CPU kernel, device for the CUDA ones). Null: one document.
struct DocumentMask {
  const int32_t* query_doc_start = nullptr;  // [batch, q_len]: where row i's document begins
  const int32_t* key_doc_end = nullptr;      // [batch, kv_len]: one past where key j's ends
  int64_t key_position0 = 0;
  bool active() const { return query_doc_start != nullptr; }
};

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
  // Packed documents; with none active every key before the query is in its document.
  DocumentMask documents;
};

// The keys row i of sequence b sees: [first, end), empty when first >= end.
struct VisibleKeys {
  int64_t first = 0, end = 0;
};
inline VisibleKeys visible_keys(int64_t b, int64_t i, const AttentionShape& s) {
  const int64_t last = i + s.causal_offset;  // the query's position among the keys
  auto clamp = [&](int64_t x) { return x < 0 ? 0 : (x > s.kv_len ? s.kv_len : x); };
  int64_t first = s.window > 0 ? last - s.window + 1 : 0;
  if (s.documents.active()) {
    const int64_t doc_first =
        s.documents.query_doc_start[b * s.q_len + i] - s.documents.key_position0;
    first = first > doc_first ? first : doc_first;
  }
  return {clamp(first), clamp(last + 1)};
}

// The query rows of sequence b that see key j: [first, end), empty when first >= end (the
// inverse of visible_keys: row i is in it iff j is in visible_keys(b, i, s)).
struct VisibleRows {
  int64_t first = 0, end = 0;
};
inline VisibleRows visible_rows(int64_t b, int64_t j, const AttentionShape& s) {
  auto clamp = [&](int64_t x) { return x < 0 ? 0 : (x > s.q_len ? s.q_len : x); };
  int64_t end = s.window > 0 ? j - s.causal_offset + s.window : s.q_len;
  if (s.documents.active()) {
    const int64_t doc_end =
        s.documents.key_doc_end[b * s.kv_len + j] - s.documents.key_position0 - s.causal_offset;
    end = end < doc_end ? end : doc_end;
  }
  return {clamp(j - s.causal_offset), clamp(end)};
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
