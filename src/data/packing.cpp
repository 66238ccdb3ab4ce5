// Packing documents into windows: pieces cut by data.long_documents, then best-fit decreasing.
#include "data/packing.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "core/error.h"

namespace frugal {

Packing resolved_packing(Packing mode, uint32_t content) {
  if (mode != Packing::automatic) return mode;
  const uint32_t structured =
      content_bit(DocumentContent::instruction) | content_bit(DocumentContent::chat);
  return (content & structured) != 0 ? Packing::documents : Packing::windows;
}

namespace {

// The pieces of one document of n tokens starting at token `first` (see packing.h).
void cut_document(uint64_t first, uint64_t n, uint64_t seq, LongDocuments long_docs,
                  std::vector<PackedPiece>& pieces, PackingCounts& counts) {
  if (n <= seq) {
    pieces.push_back({first, uint32_t(n), false});
    return;
  }
  if (long_docs == LongDocuments::truncate) {
    // seq rows, the last predicting token seq: seq + 1 tokens of the document are read.
    pieces.push_back({first, uint32_t(seq), true});
    ++counts.truncated;
    counts.dropped_tokens += n - seq - 1;
    return;
  }
  ++counts.split;
  uint64_t at = 0;
  for (; n - at > seq; at += seq) pieces.push_back({first + at, uint32_t(seq), true});
  pieces.push_back({first + at, uint32_t(n - at), false});
}

}  // namespace

PackedWindows::PackedWindows(std::span<const uint64_t> document_starts, int64_t seq_len,
                             Packing mode, LongDocuments long_docs, const std::string& file)
    : seq_len_(seq_len), mode_(mode) {
  if (seq_len < 1) fail("packing '", file, "': seq_len ", seq_len, " must be at least 1");
  if (mode != Packing::documents && mode != Packing::pad)
    fail("packing '", file, "': data.packing = ", enum_name(mode),
         " does not pack documents (internal: resolve auto first)");
  if (document_starts.size() < 2)
    fail("data.packing = ", enum_name(mode), ": '", file,
         "' records no document boundaries (a version 1 token file); prepare it again with "
         "`frugal prepare`, or use data.packing = windows");
  if (seq_len > int64_t(UINT32_MAX))
    fail("packing '", file, "': seq_len ", seq_len, " is too long for a packed window");
  const auto seq = static_cast<uint64_t>(seq_len);
  std::vector<PackedPiece> pieces;
  counts_.documents = document_starts.size() - 1;
  for (size_t d = 0; d + 1 < document_starts.size(); ++d) {
    const uint64_t n = document_starts[d + 1] - document_starts[d];
    counts_.longest_document = std::max(counts_.longest_document, n);
    cut_document(document_starts[d], n, seq, long_docs, pieces, counts_);
  }
  counts_.pieces = pieces.size();

  // Which window each piece goes to. pad: its own. documents: best-fit decreasing, the
  // classic bin-packing heuristic (within 11/9 of the fewest windows): longest pieces first
  // (ties in file order, so the result is deterministic), each into the window it fills best.
  std::vector<uint64_t> window_of(pieces.size());
  uint64_t windows = 0;
  if (mode == Packing::pad) {
    std::iota(window_of.begin(), window_of.end(), uint64_t{0});
    windows = pieces.size();
  } else {
    std::vector<uint64_t> order(pieces.size());
    std::iota(order.begin(), order.end(), uint64_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](uint64_t a, uint64_t b) { return pieces[a].rows > pieces[b].rows; });
    // Open windows by rows left; among equal room the earliest opened comes first.
    std::multimap<uint64_t, uint64_t> room;
    for (const uint64_t p : order) {
      const uint64_t rows = pieces[p].rows;
      auto fit = room.lower_bound(rows);
      uint64_t w, left;
      if (fit == room.end()) {
        w = windows++;
        left = seq;
      } else {
        w = fit->second;
        left = fit->first;
        room.erase(fit);
      }
      window_of[p] = w;
      if (left - rows > 0) room.emplace(left - rows, w);
    }
  }
  // Pieces window by window; within a window in file order.
  std::vector<uint64_t> count(windows + 1, 0);
  for (const uint64_t w : window_of) ++count[w + 1];
  std::partial_sum(count.begin(), count.end(), count.begin());
  window_first_ = count;
  pieces_.resize(pieces.size());
  for (size_t p = 0; p < pieces.size(); ++p) pieces_[count[window_of[p]]++] = pieces[p];
  counts_.windows = windows;
  for (const PackedPiece& p : pieces_) counts_.rows_used += p.rows;
}

double skipped_attention_tiles(std::span<const int32_t> start) {
  constexpr int64_t kTile = 128;
  const auto seq_len = static_cast<int64_t>(start.size());
  const int64_t tiles = (seq_len + kTile - 1) / kTile;
  // Row i sees rows [start[i], i], so the rows of query tile m together see [smallest start, last
  // row]: key tiles from that start's tile to m.
  int64_t causal = 0, visible = 0;
  for (int64_t m = 0; m < tiles; ++m) {
    const int64_t first_row = m * kTile, end_row = std::min(seq_len, first_row + kTile);
    int64_t min_start = seq_len;
    for (int64_t t = first_row; t < end_row; ++t)
      min_start = std::min<int64_t>(min_start, start[size_t(t)]);
    causal += m + 1;
    visible += m - min_start / kTile + 1;
  }
  return causal > 0 ? double(causal - visible) / double(causal) : 0.0;
}

}  // namespace frugal
