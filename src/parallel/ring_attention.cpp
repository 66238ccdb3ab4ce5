// Ring attention: the zigzag layout helpers, and the forward and backward ring schedules over
// a Comm (MPI on host tensors, NCCL on GPU tensors), built on ops::attention_block and its
// backward. On a GPU the inputs are bf16; the running output and the dK/dV accumulators that
// travel are fp32 on both devices.
//
// Why the zigzag layout balances the work. Rank k holds query chunks k and 2P-1-k. At ring
// step s it holds the K/V of rank r = k - s (mod P), chunks r and 2P-1-r. Block pairs whose
// key chunk is after the query chunk are fully masked and skipped; with c tokens per chunk:
//   s = 0 (r = k): (k, k) and (2P-1-k, 2P-1-k) are diagonal (c^2/2 each), (2P-1-k, k) full,
//                  (k, 2P-1-k) masked                                   -> 2 c^2 /2 + c^2
//   r < k:         both query chunks see chunk r fully; chunk 2P-1-r (> 2P-1-k > k) is after
//                  both                                                 -> 2 c^2
//   r > k:         query chunk 2P-1-k (>= P > r) sees both kv chunks fully; query chunk k sees
//                  neither                                              -> 2 c^2
// so every rank does 2c^2 of score work at every step (the diagonal step counting the masked
// halves of its two diagonal blocks), and no rank waits for a slower neighbour. A contiguous
// split (rank k holds tokens [kS/P, (k+1)S/P)) would give rank P-1 P times the work of rank 0.
// A sliding window of W tokens adds skips: a block pair whose nearest query and key are W or
// more apart is not computed (the K/V still pass through, to keep the ring's schedule), so
// with W <= c each rank computes about its two chunks' diagonal blocks and their left
// neighbours, O(c * W) each, whatever the sequence length.
//
// Packed documents (a query sees only keys of its own document) change the schedule, decided
// alike on every rank from the bounds of every chunk, gathered once per micro-batch
// (ring_documents.h):
//  - a block pair (query chunk x, key chunk y) is computed iff some row of x, in some sequence
//    of the micro-batch, sees some key of y: y <= x, and the lowest document start of x's rows
//    (raised to x*c - W + 1 with a window W) is at or before y's last key;
//  - rank k needs half h of rank r's K/V (chunk y) iff one of k's query chunks has (x, y)
//    computed. The K/V do not relay: at step s rank k still holds (what it needs of) rank
//    k-s's K/V, but receives it straight from rank k-s, in the transfers posted at step s-1, and
//    only the halves it needs; a rank that needs nothing of k-s receives nothing, and k-s sends
//    nothing. A relay would not save much: with documents shorter than a chunk, chunk y is
//    needed only by chunk y+1, which for the second halves (y >= P) is held by the rank BEFORE
//    y's owner, P-1 hops along the ring. Directly, each such transfer is one chunk between
//    neighbours: with documents of ~512 tokens and chunks of 4k only steps 1 and P-1 move
//    anything, one chunk (of K and V) a rank each; documents that end at chunk boundaries move
//    nothing.
//  - backward: the same K/V transfers; the dK/dV a rank computes for rank r's K/V at step s go
//    straight back to r with the transfers posted at step s+1 (so that they overlap step s+1's
//    compute), only the halves it computed, and r adds them into its own.
// A sender's "what rank t needs of my K/V" and its receiver's "what I need of rank r's" are one
// value computed alike on both, so sends and receives match. Each step's transfers are posted
// in one CommGroup in the same order on every rank (K/V send, K/V receive, dK/dV send, dK/dV
// receive): NCCL, which pairs two ranks' operations in the order they are issued, pairs them
// alike. Memory: this rank's K/V and two receive buffers, and four fp32 dK/dV blocks (its own
// sum, the two of the steps being computed and sent, one received): one of each more than the
// relay, which frees the K/V it passes on and sums the dK/dV on the way.
#include "parallel/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "core/error.h"
#include "ops/attention_offset.h"
#include "ops/attention_offset_backward.h"
#include "ops/ops.h"
#include "parallel/ring_documents.h"

namespace frugal {

namespace {

// MPI tags of the two kinds of ring messages (NCCL ignores tags and matches in issue order,
// which is the same on every rank).
constexpr int kTagKv = 0x5241;   // K/V blocks
constexpr int kTagDkv = 0x5242;  // dK/dV accumulators

// x holds `outer` blocks, each made of two halves of equal size (the two chunks of a
// sequence, or of one lse row). Returns the given half of every block, concatenated, viewed
// as `shape`.
// (Block copies through ops::copy, so the same code moves host and device memory.)
Tensor take_half(const Tensor& x, int64_t outer, int half, const Shape& shape) {
  Tensor part = ops::empty_like(x, shape, x.dtype());
  FRUGAL_CHECK(part.numel() * 2 == x.numel(), "half of ", shape_string(x.shape()), " as ",
               shape_string(shape));
  const int64_t half_len = x.numel() / (2 * outer);
  const Tensor blocks = x.view({2 * outer, half_len});
  Tensor parts = part.view({outer, half_len});
  for (int64_t o = 0; o < outer; ++o) {
    Tensor dst = parts.rows(o, o + 1);
    ops::copy(dst, blocks.rows(2 * o + half, 2 * o + half + 1));
  }
  return part;
}

// The inverse of take_half: writes part into the given half of every block of x.
void put_half(Tensor& x, int64_t outer, int half, const Tensor& part) {
  FRUGAL_CHECK(part.numel() * 2 == x.numel() && part.dtype() == x.dtype(), "half ",
               shape_string(part.shape()), " into ", shape_string(x.shape()));
  const int64_t half_len = x.numel() / (2 * outer);
  Tensor blocks = x.view({2 * outer, half_len});
  const Tensor parts = part.view({outer, half_len});
  for (int64_t o = 0; o < outer; ++o) {
    Tensor dst = blocks.rows(2 * o + half, 2 * o + half + 1);
    ops::copy(dst, parts.rows(o, o + 1));
  }
}

// The chunk index of half `half` of rank `rank`'s rows, with P ranks.
int64_t chunk_of(int rank, int half, int P) { return half == 0 ? rank : 2 * int64_t(P) - 1 - rank; }

// What travels the ring: K and V of one rank, half-major so that each (half, tensor) is a
// contiguous [batch * c, n_kv_heads, D] window and each half's K and V are next to each other:
// [K half 0, V half 0, K half 1, V half 1], `rows` = batch * c rows each. One message per step
// instead of four, and with packed documents one contiguous window for the halves a rank needs.
// The dK/dV accumulators have the same layout.
Tensor key_rows(const Tensor& kv, int64_t rows, int half) {
  return kv.rows(2 * half * rows, (2 * half + 1) * rows);
}
Tensor value_rows(const Tensor& kv, int64_t rows, int half) {
  return kv.rows((2 * half + 1) * rows, (2 * half + 2) * rows);
}
// The rows of the halves in `halves` (bit h: half h; 1, 2 or 3).
Tensor halves_rows(const Tensor& kv, int64_t rows, int halves) {
  return kv.rows(halves & 1 ? 0 : 2 * rows, halves & 2 ? 4 * rows : 2 * rows);
}

Tensor pack_kv(const Tensor& k, const Tensor& v, int64_t batch) {
  const int64_t rows = k.size(0) / 2;
  Tensor kv = ops::empty_like(k, {4 * rows, k.size(1), k.size(2)}, k.dtype());
  const Shape quarter_shape{rows, k.size(1), k.size(2)};
  for (int half = 0; half < 2; ++half) {
    Tensor k_quarter = key_rows(kv, rows, half), v_quarter = value_rows(kv, rows, half);
    ops::copy(k_quarter, take_half(k, batch, half, quarter_shape));
    ops::copy(v_quarter, take_half(v, batch, half, quarter_shape));
  }
  return kv;
}

struct RingShape {
  int64_t batch = 0, chunk = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int P = 1, rank = 0;
  int next() const { return (rank + 1) % P; }
  int prev() const { return (rank + P - 1) % P; }
  // The rank whose K/V this rank holds at step s.
  int source(int s) const { return (rank - s % P + P) % P; }
};

// One step of the ring: `out` goes to the next rank while `in` arrives from the previous
// one, as one group (NCCL would deadlock on an ungrouped send/recv pair).
struct RingTransfer {
  Pending send, recv;
};
RingTransfer pass_along(Comm& cp, const RingShape& r, const Tensor& out, Tensor& in, int tag) {
  RingTransfer t;
  CommGroup group(cp);
  t.send = cp.send(out, r.next(), tag);
  t.recv = cp.recv(in, r.prev(), tag);
  group.end();
  return t;
}

RingShape ring_shape(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch,
                     const Comm& cp) {
  for (const Tensor* t : {&q, &k, &v})
    FRUGAL_CHECK(t->defined() && t->device() == q.device() &&
                     t->dtype() == ops::compute_dtype(q.device()) && t->ndim() == 3,
                 "ring attention takes ", dtype_name(ops::compute_dtype(q.device())),
                 " tensors [rows, heads, head_dim] of one device");
  FRUGAL_CHECK(batch > 0 && q.size(0) % (2 * batch) == 0 && k.shape() == v.shape() &&
                   k.size(0) == q.size(0) && k.size(2) == q.size(2) && q.size(1) % k.size(1) == 0,
               "ring attention q ", shape_string(q.shape()), " k ", shape_string(k.shape()), " v ",
               shape_string(v.shape()), " batch ", batch);
  RingShape r;
  r.batch = batch;
  r.chunk = q.size(0) / (2 * batch);
  r.heads = q.size(1);
  r.kv_heads = k.size(1);
  r.head_dim = q.size(2);
  r.P = cp.size();
  r.rank = cp.rank();
  return r;
}

// For query chunk qc against key chunk kc (chunk indices in the padded sequence): the
// causal_offset of attention_block, or -1 when no query sees any key (skip).
// Query i of qc is at qc*c + i, key j of kc at kc*c + j; it sees j <= i + (qc - kc) * c, and
// with a sliding window also i + offset - j < window. The nearest pair (i = 0, j = c - 1) is
// offset - (c - 1) apart: when even that is >= window, the whole block is outside it.
int64_t block_offset(int64_t qc, int64_t kc, int64_t chunk, int64_t window) {
  if (kc > qc) return -1;
  const int64_t offset = (qc - kc) * chunk;
  if (window > 0 && offset - (chunk - 1) >= window) return -1;
  return offset;
}

// Calls f(query half, key half, causal offset) for each block pair of step s that is not
// fully masked: this rank's two query chunks against the two key chunks it holds then.
template <class F>
void for_each_visible_pair(const RingShape& r, int s, int64_t window, F&& f) {
  const int src = r.source(s);
  for (int qh = 0; qh < 2; ++qh)
    for (int kh = 0; kh < 2; ++kh) {
      const int64_t offset =
          block_offset(chunk_of(r.rank, qh, r.P), chunk_of(src, kh, r.P), r.chunk, window);
      if (offset >= 0) f(qh, kh, offset);
    }
}

// The local [batch * 2c, ...] tensor assembled from its two chunk-major halves.
// With `dtype`: the result rounded to it (the fp32 accumulators to the model's bf16 on a GPU).
Tensor join_halves(const Tensor& first, const Tensor& second, int64_t outer, const Shape& shape,
                   DType dtype) {
  Tensor x = ops::empty_like(first, shape, first.dtype());
  put_half(x, outer, 0, first);
  put_half(x, outer, 1, second);
  if (dtype == x.dtype()) return x;
  return ops::convert(x, dtype, x.arena());
}

// fp32 zeros, or -inf, on the device of `like`.
Tensor f32_filled(const Tensor& like, const Shape& shape, float value) {
  Tensor host = Tensor::empty(shape, DType::f32);
  std::fill(host.data<float>(), host.data<float>() + host.numel(), value);
  return ops::on_device_of(host, like);
}

}  // namespace

// --- forward ------------------------------------------------------------------------------
//
// Step s = 0 .. P-1: rank k holds the K/V of rank k - s. Before computing with it, rank k
// posts (in one CommGroup) the send of that block to k+1 and the receive of the next one
// (rank k-s-1's) from k-1 into the other buffer; it then computes the block pairs that are
// not masked, folds them into the running (out, lse), and waits for both transfers. The last
// step posts nothing. P-1 transfers of K/V in all. With packed documents the K/V come straight
// from their owner instead, only where needed (the header comment).
namespace {

// This rank's queries, split into its two chunks, and the running result of each.
struct QueryHalves {
  Tensor q[2], out[2], lse[2];
};
QueryHalves query_halves(const Tensor& q, const RingShape& r) {
  const int64_t rows = r.batch * r.chunk;
  const Shape q_half_shape{rows, r.heads, r.head_dim}, lse_half_shape{r.batch, r.heads, r.chunk};
  QueryHalves h;
  for (int half = 0; half < 2; ++half) {
    h.q[half] = take_half(q, r.batch, half, q_half_shape);
    h.out[half] = f32_filled(q, q_half_shape, 0.0f);
    h.lse[half] = f32_filled(q, lse_half_shape, -std::numeric_limits<float>::infinity());
  }
  return h;
}

// The relay of the zigzag comment: every block travels the whole ring.
void forward_relay(QueryHalves& h, const Tensor& k, const Tensor& v, const RingShape& r, Comm& cp,
                   int64_t window) {
  const int64_t rows = r.batch * r.chunk;
  Tensor kv[2];
  kv[0] = pack_kv(k, v, r.batch);
  if (r.P > 1) kv[1] = ops::empty_like(kv[0], kv[0].shape(), kv[0].dtype());
  for (int s = 0; s < r.P; ++s) {
    const Tensor& cur = kv[s % 2];
    RingTransfer next_kv;
    if (s + 1 < r.P) next_kv = pass_along(cp, r, cur, kv[(s + 1) % 2], kTagKv);
    for_each_visible_pair(r, s, window, [&](int qh, int kh, int64_t offset) {
      const ops::Attention part = ops::attention_block(
          h.q[qh], key_rows(cur, rows, kh), value_rows(cur, rows, kh), r.batch, offset, window);
      ops::merge_attention(h.out[qh], h.lse[qh], part, r.batch);
    });
    if (next_kv.send) next_kv.send->wait();
    if (next_kv.recv) next_kv.recv->wait();
  }
}

// The halves (bit h: chunk_of(source, h)) of rank `source`'s K/V that some query chunk of rank
// `rank` sees.
int needed_halves(const RingDocuments& docs, int rank, int source, int P, int64_t window) {
  int halves = 0;
  for (int kh = 0; kh < 2; ++kh)
    for (int qh = 0; qh < 2; ++qh)
      if (docs.sees(chunk_of(rank, qh, P), chunk_of(source, kh, P), window)) halves |= 1 << kh;
  return halves;
}

// The direct schedule of packed documents, on one rank: at step s (1 .. P-1) it holds the
// halves `held[s]` of rank source(s)'s K/V and rank + s holds the halves `given[s]` of its own;
// both are 0 where nothing moves.
struct DocumentSchedule {
  std::vector<int> held, given;
};
DocumentSchedule document_schedule(const RingShape& r, const RingDocuments& docs, int64_t window) {
  DocumentSchedule d;
  d.held.assign(size_t(r.P), 0);
  d.given.assign(size_t(r.P), 0);
  for (int s = 1; s < r.P; ++s) {
    d.held[size_t(s)] = needed_halves(docs, r.rank, r.source(s), r.P, window);
    d.given[size_t(s)] = needed_halves(docs, (r.rank + s) % r.P, r.rank, r.P, window);
  }
  return d;
}

// Posts (inside the caller's CommGroup) the K/V transfers that step s+1 needs: this rank's own
// halves to rank + s + 1, and those of rank - s - 1 into `into` (allocated on first use).
RingTransfer post_document_kv(Comm& cp, const RingShape& r, const DocumentSchedule& d, int s,
                              const Tensor& own, Tensor& into) {
  RingTransfer t;
  if (s + 1 >= r.P) return t;
  const int64_t rows = r.batch * r.chunk;
  if (const int give = d.given[size_t(s + 1)])
    t.send = cp.send(halves_rows(own, rows, give), (r.rank + s + 1) % r.P, kTagKv);
  if (const int take = d.held[size_t(s + 1)]) {
    if (!into.defined()) into = ops::empty_like(own, own.shape(), own.dtype());
    Tensor part = halves_rows(into, rows, take);
    t.recv = cp.recv(part, r.source(s + 1), kTagKv);
  }
  return t;
}

void wait_transfer(RingTransfer& t) {
  if (t.send) t.send->wait();
  if (t.recv) t.recv->wait();
}

// Calls f(query half, key half, causal offset, block documents) for each block pair of step s
// that shares a document: this rank's query chunks against the key chunks of rank source(s).
template <class F>
void for_each_document_pair(const RingShape& r, const RingDocuments& docs, int s, int64_t window,
                            F&& f) {
  const int src = r.source(s);
  for (int qh = 0; qh < 2; ++qh)
    for (int kh = 0; kh < 2; ++kh) {
      const int64_t qc = chunk_of(r.rank, qh, r.P), kc = chunk_of(src, kh, r.P);
      if (docs.sees(qc, kc, window)) f(qh, kh, (qc - kc) * r.chunk, docs.block(qc, kc));
    }
}

void forward_documents(QueryHalves& h, const Tensor& k, const Tensor& v, const RingShape& r,
                       Comm& cp, int64_t window, const RingDocuments& docs) {
  const int64_t rows = r.batch * r.chunk;
  const DocumentSchedule d = document_schedule(r, docs, window);
  const Tensor own = pack_kv(k, v, r.batch);
  Tensor held[2];
  for (int s = 0; s < r.P; ++s) {
    RingTransfer next_kv;
    {
      CommGroup group(cp);
      next_kv = post_document_kv(cp, r, d, s, own, held[(s + 1) % 2]);
      group.end();
    }
    const Tensor& cur = s == 0 ? own : held[s % 2];
    for_each_document_pair(
        r, docs, s, window, [&](int qh, int kh, int64_t offset, const ops::BlockDocuments& bd) {
          const ops::Attention part =
              ops::attention_block(h.q[qh], key_rows(cur, rows, kh), value_rows(cur, rows, kh),
                                   r.batch, offset, window, bd);
          ops::merge_attention(h.out[qh], h.lse[qh], part, r.batch);
        });
    wait_transfer(next_kv);
  }
}

// The documents' gathered bounds: the cache's, or gathered now into `owned`.
const RingDocuments* ring_documents(const ops::DocumentBounds& documents, const RingShape& r,
                                    Comm& cp, RingDocumentCache* cache,
                                    std::unique_ptr<RingDocuments>& owned) {
  if (!documents.defined()) return nullptr;
  if (cache) return &cache->get(documents, r.batch, r.chunk, cp);
  owned = std::make_unique<RingDocuments>(documents, r.batch, r.chunk, cp);
  return owned.get();
}

}  // namespace

ops::Attention ring_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                      int64_t batch, Comm& cp, int64_t window,
                                      const ops::DocumentBounds& documents,
                                      RingDocumentCache* cache) {
  const RingShape r = ring_shape(q, k, v, batch, cp);
  FRUGAL_CHECK(window >= 0, "ring attention window ", window);
  std::unique_ptr<RingDocuments> owned;
  const RingDocuments* docs = ring_documents(documents, r, cp, cache, owned);
  QueryHalves h = query_halves(q, r);
  if (docs)
    forward_documents(h, k, v, r, cp, window, *docs);
  else
    forward_relay(h, k, v, r, cp, window);
  return {
      join_halves(h.out[0], h.out[1], batch, q.shape(), q.dtype()),
      join_halves(h.lse[0], h.lse[1], batch * r.heads, {batch, r.heads, 2 * r.chunk}, DType::f32)};
}

// --- backward -----------------------------------------------------------------------------
//
// K/V travel exactly as in the forward (block of rank k - s at rank k on step s, prefetched
// one step ahead). Each block's fp32 dK/dV accumulator travels with it, one step behind:
//   step s on rank k: compute the local queries' contribution to block k-s into a zeroed
//   buffer (dQ accumulates locally); wait for the accumulator of block k-s from rank k-1
//   (it holds steps 0 .. s-1) and add it; send the sum to k+1 and post the receive of the
//   accumulator of block k-s-1 from k-1 (one CommGroup). That transfer overlaps step s+1's
//   compute.
// After the last step (s = P-1) rank k sends the accumulator of block k-(P-1) = k+1, now
// complete, to k+1 - its owner - and receives the one of block (k-1)-(P-1) = k: every
// dK/dV arrives home with the P-th transfer. P-1 transfers of K/V, P of dK/dV.
// With packed documents the dK/dV of a block go straight home instead (the header comment).
namespace {

// What the backward reads of this rank's queries, split into its two chunks, and their dQ.
struct BackwardHalves {
  Tensor q[2], dout[2], out[2], lse[2], dq[2];
};
BackwardHalves backward_halves(const Tensor& dout, const Tensor& q, const ops::Attention& fwd,
                               const RingShape& r) {
  const int64_t rows = r.batch * r.chunk;
  const Shape q_half_shape{rows, r.heads, r.head_dim}, lse_half_shape{r.batch, r.heads, r.chunk};
  BackwardHalves h;
  for (int half = 0; half < 2; ++half) {
    h.q[half] = take_half(q, r.batch, half, q_half_shape);
    h.dout[half] = take_half(dout, r.batch, half, q_half_shape);
    h.out[half] = take_half(fwd.out, r.batch, half, q_half_shape);
    h.lse[half] = take_half(fwd.lse, r.batch * r.heads, half, lse_half_shape);
    h.dq[half] = f32_filled(q, q_half_shape, 0.0f);
  }
  return h;
}

// Adds the gradients of block pair (qh, kh) into h.dq and `grad` (this K/V's dK/dV).
void block_backward(BackwardHalves& h, Tensor& grad, const Tensor& kv, const RingShape& r, int qh,
                    int kh, int64_t offset, int64_t window, const ops::BlockDocuments& documents) {
  const int64_t rows = r.batch * r.chunk;
  Tensor dk_part = key_rows(grad, rows, kh);
  Tensor dv_part = value_rows(grad, rows, kh);
  ops::attention_block_backward(h.dq[qh], dk_part, dv_part, h.dout[qh], h.q[qh],
                                key_rows(kv, rows, kh), value_rows(kv, rows, kh), h.out[qh],
                                h.lse[qh], r.batch, offset, window, documents);
}

// Returns this rank's dK/dV (the layout of pack_kv, fp32).
Tensor backward_relay(BackwardHalves& h, const Tensor& k, const Tensor& v, const RingShape& r,
                      Comm& cp, int64_t window) {
  Tensor kv[2], dkv_out[2], dkv_in;
  kv[0] = pack_kv(k, v, r.batch);
  dkv_out[0] = ops::empty_like(kv[0], kv[0].shape(), DType::f32);
  if (r.P > 1) {
    kv[1] = ops::empty_like(kv[0], kv[0].shape(), kv[0].dtype());
    dkv_out[1] = ops::empty_like(kv[0], kv[0].shape(), DType::f32);
    dkv_in = ops::empty_like(kv[0], kv[0].shape(), DType::f32);
  }
  Pending dkv_send[2], dkv_recv;
  for (int s = 0; s < r.P; ++s) {
    const Tensor& cur = kv[s % 2];
    RingTransfer next_kv;
    if (s + 1 < r.P) next_kv = pass_along(cp, r, cur, kv[(s + 1) % 2], kTagKv);
    // This buffer was last sent two steps ago; that send must be done before it is reused.
    Tensor& acc = dkv_out[s % 2];
    if (dkv_send[s % 2]) dkv_send[s % 2]->wait();
    ops::zero(acc);
    for_each_visible_pair(r, s, window, [&](int qh, int kh, int64_t offset) {
      block_backward(h, acc, cur, r, qh, kh, offset, window, {});
    });
    if (r.P > 1) {
      if (s > 0) {
        dkv_recv->wait();
        ops::add_inplace(acc, dkv_in);
      }
      RingTransfer dkv = pass_along(cp, r, acc, dkv_in, kTagDkv);
      dkv_send[s % 2] = std::move(dkv.send);
      dkv_recv = std::move(dkv.recv);
    }
    wait_transfer(next_kv);
  }
  if (r.P == 1) return dkv_out[0];
  dkv_recv->wait();
  for (Pending& p : dkv_send)
    if (p) p->wait();
  return dkv_in;
}

// Step s = 0 .. P: the transfers of step s (K/V for step s+1, the dK/dV computed at step s-1)
// in one group, then step s's compute (none at s = P), then the wait for those transfers and
// the sum of the dK/dV that came home.
Tensor backward_documents(BackwardHalves& h, const Tensor& k, const Tensor& v, const RingShape& r,
                          Comm& cp, int64_t window, const RingDocuments& docs) {
  const int64_t rows = r.batch * r.chunk;
  const DocumentSchedule d = document_schedule(r, docs, window);
  const Tensor own = pack_kv(k, v, r.batch);
  Tensor own_grad = ops::empty_like(own, own.shape(), DType::f32);
  ops::zero(own_grad);
  Tensor held[2], grad[2], came_home;
  for (int s = 0; s <= r.P; ++s) {
    RingTransfer next_kv, dkv;
    const int back = s >= 2 ? d.held[size_t(s - 1)] : 0;   // computed at step s-1, for its owner
    const int home = s >= 2 ? d.given[size_t(s - 1)] : 0;  // computed by rank + s - 1, for us
    {
      CommGroup group(cp);
      next_kv = post_document_kv(cp, r, d, s, own, held[(s + 1) % 2]);
      if (back)
        dkv.send = cp.send(halves_rows(grad[(s - 1) % 2], rows, back), r.source(s - 1), kTagDkv);
      if (home) {
        if (!came_home.defined()) came_home = ops::empty_like(own, own.shape(), DType::f32);
        Tensor part = halves_rows(came_home, rows, home);
        dkv.recv = cp.recv(part, (r.rank + s - 1) % r.P, kTagDkv);
      }
      group.end();
    }
    if (s < r.P && (s == 0 || d.held[size_t(s)])) {
      const Tensor& cur = s == 0 ? own : held[s % 2];
      Tensor* acc = &own_grad;
      if (s > 0) {
        acc = &grad[s % 2];
        if (!acc->defined()) *acc = ops::empty_like(own, own.shape(), DType::f32);
        Tensor used = halves_rows(*acc, rows, d.held[size_t(s)]);
        ops::zero(used);
      }
      for_each_document_pair(r, docs, s, window,
                             [&](int qh, int kh, int64_t offset, const ops::BlockDocuments& bd) {
                               block_backward(h, *acc, cur, r, qh, kh, offset, window, bd);
                             });
    }
    wait_transfer(next_kv);
    wait_transfer(dkv);
    if (home) {
      Tensor sum = halves_rows(own_grad, rows, home);
      ops::add_inplace(sum, halves_rows(came_home, rows, home));
    }
  }
  return own_grad;
}

}  // namespace

ops::AttentionGrads ring_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const ops::Attention& fwd,
                                            int64_t batch, Comm& cp, int64_t window,
                                            const ops::DocumentBounds& documents,
                                            RingDocumentCache* cache) {
  const RingShape r = ring_shape(q, k, v, batch, cp);
  FRUGAL_CHECK(window >= 0, "ring attention window ", window);
  FRUGAL_CHECK(dout.shape() == q.shape() && fwd.out.shape() == q.shape() &&
                   fwd.lse.shape() == Shape({batch, r.heads, 2 * r.chunk}),
               "ring attention backward dout ", shape_string(dout.shape()), " out ",
               shape_string(fwd.out.shape()), " lse ", shape_string(fwd.lse.shape()), " for q ",
               shape_string(q.shape()));
  std::unique_ptr<RingDocuments> owned;
  const RingDocuments* docs = ring_documents(documents, r, cp, cache, owned);
  BackwardHalves h = backward_halves(dout, q, fwd, r);
  const Tensor own = docs ? backward_documents(h, k, v, r, cp, window, *docs)
                          : backward_relay(h, k, v, r, cp, window);

  const int64_t rows = r.batch * r.chunk;
  ops::AttentionGrads g;
  g.dq = join_halves(h.dq[0], h.dq[1], batch, q.shape(), q.dtype());
  g.dk = join_halves(key_rows(own, rows, 0), key_rows(own, rows, 1), batch, k.shape(), k.dtype());
  g.dv =
      join_halves(value_rows(own, rows, 0), value_rows(own, rows, 1), batch, v.shape(), v.dtype());
  return g;
}

AttentionOperator ring_attention_operator(Comm& cp) {
  // Shared by both directions and every layer: the bounds are gathered once per micro-batch.
  auto cache = std::make_shared<RingDocumentCache>();
  AttentionOperator op;
  op.forward = [&cp, cache](const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch,
                            int64_t window, const ops::DocumentBounds& documents) {
    return ring_attention_forward(q, k, v, batch, cp, window, documents, cache.get());
  };
  op.backward = [&cp, cache](const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const ops::Attention& fwd, int64_t batch, int64_t window,
                             const ops::DocumentBounds& documents) {
    return ring_attention_backward(dout, q, k, v, fwd, batch, cp, window, documents, cache.get());
  };
  return op;
}

}  // namespace frugal
