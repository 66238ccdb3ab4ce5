// Packed documents in ring attention: every chunk's document bounds, gathered once per
// micro-batch, so that every rank of the cp group knows which block pairs share a document and
// so which K/V chunks must travel (ring_attention.cpp's schedule), and has the key ends of the
// chunks it receives.
//
// Why gather the bounds instead of sending each chunk's with its K/V: whether a transfer is made
// must be decided alike by its sender and its receiver before either posts it, and the bounds
// are the same for every layer of a micro-batch and tiny (8 bytes a token against the K/V's
// hundreds). So one all-gather of the local bounds, at the first layer's forward, serves every
// layer's forward and backward; RingDocumentCache keeps it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/attention_offset.h"
#include "ops/ops.h"
#include "parallel/comm.h"

namespace frugal {

// Throws Error naming `what` unless start[p], end[p] (p in [0, len)) describe documents that tile
// [0, len) back to back: start[p] <= p < end[p] <= len, a document begins where the one before
// it ends, and every position of a document has its bounds.
void check_document_partition(const int32_t* start, const int32_t* end, int64_t len,
                              const std::string& what);

// The document bounds of every chunk of a micro-batch in the zigzag layout of a cp group (ring
// attention's): 2P chunks of chunk_len rows per sequence, positions of the padded sequence,
// whose every position, padding included, is in a document (context_parallel_slice makes each
// padding row one of its own).
class RingDocuments {
 public:
  // local: the bounds of this rank's rows (i32 [batch * 2 * chunk_len] each, on the device of
  // the rows, in its zigzag order). A collective over cp: every rank gathers every rank's bounds
  // and checks that each sequence's tile its padded length (an Error naming the sequence
  // otherwise, alike on every rank). On a GPU this waits once for the gathered bounds.
  RingDocuments(const ops::DocumentBounds& local, int64_t batch, int64_t chunk_len, Comm& cp);

  // Whether these were gathered from the same tensors for the same ring (the cache's test; the
  // bounds are held, so no other tensor can have their addresses while they are).
  bool gathered_from(const ops::DocumentBounds& local, int64_t batch, int64_t chunk_len,
                     const Comm& cp) const;

  // Whether some query row of chunk query_chunk sees some key of chunk key_chunk in some
  // sequence of the micro-batch: causally, within its document and (window > 0) the window.
  bool sees(int64_t query_chunk, int64_t key_chunk, int64_t window) const;

  // The block pair's mask for ops::attention_block: the query chunk's document starts, the key
  // chunk's ends ([batch * chunk_len] each, on the device of the rows), its first key's position.
  ops::BlockDocuments block(int64_t query_chunk, int64_t key_chunk) const;

 private:
  ops::DocumentBounds local_;  // what was gathered, held so that its addresses identify it
  int64_t batch_ = 0, chunk_len_ = 0;
  const Comm* cp_ = nullptr;
  // Chunk-major, on the device of the rows: chunk x's rows of sequences 0 .. batch-1 at
  // [x * batch * chunk_len, (x + 1) * batch * chunk_len).
  Tensor starts_, ends_;
  // Per chunk, the lowest document start of its rows over the micro-batch: the earliest key
  // position any of its rows sees.
  std::vector<int64_t> lowest_start_;
};

// The RingDocuments of the micro-batch in flight: gathered at the first call with new bounds
// (new tensors: the bounds of a micro-batch are made once and not rewritten in place), reused by
// every later call with the same ones. Every rank of the group must call it with the same
// sequence of micro-batches, as the model does, so that all gather together.
class RingDocumentCache {
 public:
  const RingDocuments& get(const ops::DocumentBounds& local, int64_t batch, int64_t chunk_len,
                           Comm& cp);

 private:
  std::unique_ptr<RingDocuments> cached_;
};

}  // namespace frugal
