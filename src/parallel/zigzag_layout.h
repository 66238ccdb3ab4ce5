// The zigzag layout of context parallelism: each sequence is split over the cp ranks so that
// every rank has the same causal work (ring_attention.cpp says why), and a micro-batch's share
// of it on one rank.
//
// A sequence of S tokens is padded to S_pad, a multiple of 2P (P = cp ranks), and cut into 2P
// chunks of c = S_pad / (2P) tokens. Rank k holds chunks k and 2P-1-k, in that order: its local
// rows are [chunk k | chunk 2P-1-k], 2c per sequence, and a batch of B sequences is
// [B * 2c, ...] with each sequence's rows together (as in ops::attention). The padding sits at
// the end of the sequence, so under the causal mask no real token ever sees it; the caller only
// has to keep it out of the loss (its output gradient must be zero).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/llama_model.h"
#include "parallel/comm.h"

namespace frugal {

struct ZigzagLayout {
  int64_t seq_len = 0;     // S: real tokens per sequence
  int64_t padded_len = 0;  // S_pad: S rounded up to a multiple of 2 * cp_size
  int64_t chunk_len = 0;   // c = S_pad / (2 * cp_size)
  int cp_size = 1;
  int cp_rank = 0;

  int64_t local_len() const { return 2 * chunk_len; }  // rows per sequence on this rank
  // The chunk index (0 .. 2P-1) of this rank's first (half 0) or second (half 1) chunk.
  int64_t chunk(int half) const { return half == 0 ? cp_rank : 2 * int64_t(cp_size) - 1 - cp_rank; }
};

// Throws Error for seq_len < 1, cp_size < 1 or a rank outside [0, cp_size).
ZigzagLayout zigzag_layout(int64_t seq_len, int cp_size, int cp_rank);

// The positions (0 .. S_pad-1) of this rank's local rows of one sequence, in local order:
// chunk k's positions, then chunk 2P-1-k's. Positions >= seq_len are padding.
std::vector<int64_t> zigzag_token_indices(const ZigzagLayout& layout);

// i32 [batch * local_len]: the real position of every local token (for RoPE), padding rows
// included (they continue past seq_len).
Tensor zigzag_positions(const ZigzagLayout& layout, int64_t batch);

// full [batch * seq_len, ...] -> this rank's rows [batch * local_len, ...], padding rows zero.
// Any dtype (activations, token ids, targets); a caller that needs another padding value
// (targets = -1) writes it at the padding rows that zigzag_token_indices names.
Tensor zigzag_scatter(const Tensor& full, const ZigzagLayout& layout, int64_t batch);

// The inverse on one rank: writes the local rows [batch * local_len, ...] into their places of
// full [batch * seq_len, ...] (padding rows are dropped, other rows of full are untouched).
void zigzag_place(Tensor& full, const Tensor& local, const ZigzagLayout& layout, int64_t batch);

// The inverse over the cp group (a collective): every rank returns the whole
// [batch * seq_len, ...] tensor assembled from all the ranks' local rows.
Tensor zigzag_gather(const Tensor& local, const ZigzagLayout& layout, int64_t batch, Comm& cp);

// This rank's share of a micro-batch of whole sequences: its zigzag rows of the tokens and
// targets (padding rows get target -1, so the loss skips them) and their positions. Without
// documents the positions are the rows' places in the sequence (whole.positions unused); with
// packed documents (whole.documents, a tiling of each sequence, checked) the rows' own
// positions from whole.positions and their documents' bounds; each padding row is a document of
// one token (no real token sees it, and the ring moves nothing for it), its position continuing
// past seq_len.
Batch context_parallel_slice(const Batch& whole, const ZigzagLayout& layout);

}  // namespace frugal
