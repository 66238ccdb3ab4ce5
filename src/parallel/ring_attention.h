// Ring attention (context parallelism): each sequence is split over the cp ranks in the
// load-balanced zigzag layout (zigzag_layout.h); queries stay, key/value blocks travel the ring.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/llama_block.h"
#include "model/llama_model.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "parallel/ring_documents.h"
#include "parallel/zigzag_layout.h"

namespace frugal {

// Causal attention of this rank's queries against the keys of the whole sequence.
// q [batch * 2c, n_heads, D], k, v [batch * 2c, n_kv_heads, D] in the zigzag layout of the
// cp group (rank cp.rank() of cp.size()); GQA as in ops::attention (no K/V copy per head).
// Returns out [batch * 2c, n_heads, D] and lse [batch, n_heads, 2c], both of the whole
// sequence's softmax, in the local layout. window > 0: Mistral's sliding window (position p
// sees keys p - window < j <= p); block pairs wholly outside it are skipped, not masked, but
// without documents the K/V still travel the whole ring (every rank takes part in every
// transfer). A collective over cp: every rank calls it.
// documents: packed documents, the bounds of the local rows (i32 [batch * 2c] each, positions
// of the padded sequence, which they tile, padding included: context_parallel_slice's); a query
// sees only keys of its document. Then only the block pairs that share a document are computed
// and only the K/V chunks some rank needs travel (ring_attention.cpp's header). The bounds are
// gathered over cp, by `cache` once per micro-batch (null: at this call).
ops::Attention ring_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                      int64_t batch, Comm& cp, int64_t window = 0,
                                      const ops::DocumentBounds& documents = {},
                                      RingDocumentCache* cache = nullptr);

// Gradients of ring_attention_forward: dout like q, fwd = what the forward returned for these
// q, k, v (and documents). Returns dq, dk, dv of this rank's rows (the dk, dv of a rank's keys
// include the contributions of every rank's queries). A collective over cp.
ops::AttentionGrads ring_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const ops::Attention& fwd,
                                            int64_t batch, Comm& cp, int64_t window = 0,
                                            const ops::DocumentBounds& documents = {},
                                            RingDocumentCache* cache = nullptr);

// The model's view of ring attention: both directions bound to the cp group, sharing one
// RingDocumentCache (every layer of a micro-batch has the same document bounds).
AttentionOperator ring_attention_operator(Comm& cp);

}  // namespace frugal
