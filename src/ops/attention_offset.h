// Attention of a block of queries against a longer run of keys: the new tokens of a KV-cache
// step against everything cached so far. Kept apart from ops.h, which holds the operations
// of training; this one only the inference path needs.
#pragma once

#include "ops/ops.h"

namespace frugal::ops {

// q [B*Sq, n_heads, D]; k, v [B*Skv, n_kv_heads, D]. Query row i of a sequence sees key row
// j of that sequence iff j <= i + causal_offset; with Sq == Skv and causal_offset 0 this is
// ops::attention. For a cache step, causal_offset = the number of cached tokens before the
// first query (then the last query sees every key). window > 0 hides key j from row i unless
// i + causal_offset - j < window (Mistral's sliding window); 0: none. With `documents`, also
// only keys of the query's own document. Returns out
// [B*Sq, n_heads, D] and the log-sum-exp [B, n_heads, Sq].
// Packed documents of a block pair (cpu::DocumentMask): where the query rows' documents start
// (i32 [B*Sq]), where the key rows' documents end (i32 [B*Skv]), in positions of the whole
// sequence, and the position of each sequence's first key row. Undefined: one document.
struct BlockDocuments {
  Tensor query_doc_start, key_doc_end;
  int64_t key_position0 = 0;
  bool defined() const { return query_doc_start.defined(); }
};
// The kernels' mask of a block pair (checked against the rows of q and k; null pointers when
// `documents` is undefined).
cpu::DocumentMask block_document_mask(const BlockDocuments& documents, const Tensor& q,
                                      const Tensor& k, const char* what);

Attention attention_block(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch,
                          int64_t causal_offset, int64_t window = 0,
                          const BlockDocuments& documents = {});

// Folds one block's result `part` into the running result (out fp32 [B*T, H, D], lse [B, H, T])
// of the same query rows, by their log-sum-exps: lse' = log(exp(lse) + exp(part.lse)),
// out' = exp(lse - lse') out + exp(part.lse - lse') part.out. Rows that saw no key of the
// block (part.lse = -inf) stay as they are. Ring attention merges its blocks with it.
void merge_attention(Tensor& out, Tensor& lse, const Attention& part, int64_t batch);

}  // namespace frugal::ops
