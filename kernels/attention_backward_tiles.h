// The tiling of the Hopper attention backward (flash_attention_sm90.cu), shared by the kernel
// and its CPU unit test: which query tiles a block of keys visits, and in which order the key
// blocks add their parts of dQ into one query tile.
//
// Key block n holds keys [n kBlockN, n kBlockN + kBlockN); query tile m holds rows
// [m kBlockM, m kBlockM + kBlockM), aligned to kBlockM for every key block, so that "tile m"
// names the same rows (and the same dQ rows) in every block that adds to them. Block n visits
// the tiles [begin, end) that hold a row seeing one of its keys; both bounds never decrease as
// n grows (begin is causal; end is the window's or, with packed documents, the document's end
// of the block's last key, both non-decreasing along the keys). So the blocks that add to tile m
// are a run [n_first, n_last], and block n adds after the n_last - n blocks after it: dQ is summed
// in a fixed order (last_key_block_of_tile). Descending, as FlashAttention-3's deterministic
// backward: block n + 1 starts 2 tiles further down than block n (kBlockN = 2 kBlockM) and walks up
// at the same pace, so it is always ahead and block n does not wait, whereas in ascending order
// block n would wait at every tile.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace frugal::flash_tiles {

// The mask as the kernels' Params hold it: row i sees key j iff 0 <= i + causal_offset - j
// (< window when window > 0) and j < kv_len, and with packed documents (key_doc_end not null)
// i < key_doc_end[j] - query_position0 (cpu::DocumentMask: query row i is at position
// query_position0 + i of the whole sequence, query_position0 = key_position0 + the caller's
// causal_offset, which causal_offset here may be a clamp of). key_doc_end: this sequence's
// [kv_len] ends, where the code that reads it runs (device memory in the kernels).
struct BackwardTiling {
  int q_len, kv_len, causal_offset, window;
  int block_m, block_n;  // query rows per tile, keys per block
  const int32_t* key_doc_end = nullptr;
  int64_t query_position0 = 0;
};

struct TileRange {
  int begin, end;  // query tiles [begin, end); empty when begin == end
};

FRUGAL_HOST_DEVICE inline int query_tiles(const BackwardTiling& t) {
  return (t.q_len + t.block_m - 1) / t.block_m;
}

FRUGAL_HOST_DEVICE inline int clamp_to(int x, int lo, int hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// The query tiles key block n visits. Rows before first_row see none of its keys (causality);
// with a window, rows from end_row on are window or more past its last key, and with packed
// documents past its last key's document. An empty range is put at 0 when the block's keys are
// behind every row's window (or their documents end before the first row) and at query_tiles
// when they are after every row: that keeps begin and end non-decreasing in n. (A document holds
// its key's own position, so it never empties a range whose first row is past 0: end_row > 0
// there, and begin is first_row / block_m as without documents.)
FRUGAL_HOST_DEVICE inline TileRange query_tiles_of_key_block(const BackwardTiling& t, int n) {
  const int first_key = n * t.block_n;
  const int last_key = (first_key + t.block_n < t.kv_len ? first_key + t.block_n : t.kv_len) - 1;
  const int first_row = clamp_to(first_key - t.causal_offset, 0, t.q_len);
  int end_row =
      t.window > 0 ? clamp_to(last_key - t.causal_offset + t.window, 0, t.q_len) : t.q_len;
  if (t.key_doc_end != nullptr) {
    const int64_t doc_end = t.key_doc_end[last_key] - t.query_position0;
    if (doc_end < end_row) end_row = doc_end < 0 ? 0 : static_cast<int>(doc_end);
  }
  if (end_row > first_row) return {first_row / t.block_m, (end_row + t.block_m - 1) / t.block_m};
  const int at = end_row == 0 ? 0 : query_tiles(t);
  return {at, at};
}

// The last of the key blocks [0, n_blocks) whose range begins at or before query tile m (-1 if
// none): when some block visits tile m, the last that does, and a block that visits it adds its
// part of dQ after (this - its index) others. A binary search on the non-decreasing begin of
// query_tiles_of_key_block, so that the order is defined by the very ranges the blocks walk.
FRUGAL_HOST_DEVICE inline int last_key_block_of_tile(const BackwardTiling& t, int m, int n_blocks) {
  int lo = 0, hi = n_blocks;  // the first block beginning after m is in [lo, hi]
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (query_tiles_of_key_block(t, mid).begin > m)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo - 1;
}

}  // namespace frugal::flash_tiles
