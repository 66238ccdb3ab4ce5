// The backward of attention_block (attention_offset.h): gradients of one block of queries
// against one block of keys with a causal offset, ACCUMULATED into caller-owned buffers, so
// that ring attention can add the contributions of every block pair into the same dQ, dK, dV.
#pragma once

#include "ops/attention_offset.h"
#include "ops/ops.h"

namespace frugal::ops {

// q, dout, out [B*Sq, n_heads, D]; k, v [B*Skv, n_kv_heads, D]; lse [B, n_heads, Sq].
// dq += dL/dq, dk += dL/dk, dv += dL/dv (zero them before the first block). Query row i of a
// sequence sees key row j iff j <= i + causal_offset (and, with window > 0,
// i + causal_offset - j < window; with documents, only keys of its document), as in
// attention_block. `out` and `lse`
// must be the MERGED output and log-sum-exp of each query row over ALL the blocks it attends
// to (not this block's own), so that the recomputed probabilities are those of the full
// softmax.
void attention_block_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, int64_t batch, int64_t causal_offset,
                              int64_t window = 0, const BlockDocuments& documents = {});

}  // namespace frugal::ops
