// The Hopper attention backward's tiling (kernels/attention_backward_tiles.h) against brute
// force over the mask itself (cpu::visible_keys, packed documents included): every (row, key)
// pair the mask shows is in a tile its key block visits, and a block visits no tile outside its
// keys' rows (no work on tiles the window or the documents hide wholly); the ranges never move
// back as the block index grows (so the
// blocks adding to one tile are a run), and the last block of each tile is the last that
// visits it. A block waiting for a count that no run reaches would hang the GPU kernel; one
// adding out of turn would make dQ's bits depend on timing.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "kernels/attention_backward_tiles.h"
#include "kernels/cpu/attention.h"

using namespace frugal;
using flash_tiles::BackwardTiling;

namespace {

// Packed documents over the positions of one sequence that a block pair's rows take (query row
// i at key_position0 + offset + i, key j at key_position0 + j), as cpu::DocumentMask holds them.
struct Documents {
  std::vector<int32_t> query_doc_start, key_doc_end;
  int64_t key_position0 = 0;
};

// Documents cut at `cuts` (positions where a document begins, ascending, each > 0) of a
// sequence of `length` positions, seen by q_len rows and kv_len keys placed as above.
Documents documents_at(const std::vector<int>& cuts, int length, int q_len, int kv_len,
                       int64_t key_position0, int64_t offset) {
  auto start_of = [&](int64_t pos) {
    int64_t start = 0;
    for (int c : cuts)
      if (c <= pos) start = c;
    return static_cast<int32_t>(start);
  };
  auto end_of = [&](int64_t pos) {
    for (int c : cuts)
      if (c > pos) return static_cast<int32_t>(c);
    return static_cast<int32_t>(length);
  };
  Documents d;
  d.key_position0 = key_position0;
  for (int i = 0; i < q_len; ++i) d.query_doc_start.push_back(start_of(key_position0 + offset + i));
  for (int j = 0; j < kv_len; ++j) d.key_doc_end.push_back(end_of(key_position0 + j));
  return d;
}

// Random cuts over [0, length): documents of 1 to max_doc positions, now and then one run long.
std::vector<int> random_cuts(std::mt19937& rng, int length, int max_doc) {
  auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<int> cuts;
  for (int pos = draw(1, max_doc); pos < length;
       pos += draw(0, 9) == 0 ? draw(1, 3 * max_doc) : draw(1, max_doc))
    cuts.push_back(pos);
  return cuts;
}

// t.key_doc_end, when set, points into `docs` (the caller sets both).
void check_tiling(const BackwardTiling& t, const Documents* docs = nullptr) {
  INFO("q_len " << t.q_len << " kv_len " << t.kv_len << " offset " << t.causal_offset << " window "
                << t.window << " block_m " << t.block_m << " block_n " << t.block_n << " documents "
                << (docs != nullptr) << " key_position0 "
                << (docs != nullptr ? docs->key_position0 : 0));
  cpu::AttentionShape s;
  s.q_len = t.q_len;
  s.kv_len = t.kv_len;
  s.causal_offset = t.causal_offset;
  s.window = t.window;
  if (docs != nullptr) {
    s.documents.query_doc_start = docs->query_doc_start.data();
    s.documents.key_doc_end = docs->key_doc_end.data();
    s.documents.key_position0 = docs->key_position0;
  }
  const int n_blocks = (t.kv_len + t.block_n - 1) / t.block_n;
  const int n_tiles = flash_tiles::query_tiles(t);
  std::vector<flash_tiles::TileRange> ranges;
  for (int n = 0; n < n_blocks; ++n) ranges.push_back(flash_tiles::query_tiles_of_key_block(t, n));
  // Brute force: sees[n][m] when some row of tile m sees some key of block n.
  std::vector<std::vector<bool>> sees(static_cast<size_t>(n_blocks),
                                      std::vector<bool>(static_cast<size_t>(n_tiles)));
  for (int i = 0; i < t.q_len; ++i) {
    const cpu::VisibleKeys keys = cpu::visible_keys(0, i, s);
    for (int64_t j = keys.first; j < keys.end; ++j)
      sees[size_t(j / t.block_n)][size_t(i / t.block_m)] = true;
  }
  for (int n = 0; n < n_blocks; ++n) {
    const auto r = ranges[size_t(n)];
    REQUIRE(0 <= r.begin);
    REQUIRE(r.begin <= r.end);
    REQUIRE(r.end <= n_tiles);
    int first_seen = n_tiles, last_seen = -1;
    for (int m = 0; m < n_tiles; ++m)
      if (sees[size_t(n)][size_t(m)]) {
        INFO("block " << n << " tile " << m);
        REQUIRE(r.begin <= m);
        REQUIRE(m < r.end);
        first_seen = std::min(first_seen, m);
        last_seen = m;
      }
    // And no more: the tiles outside the rows that see a key of the block (causality, the
    // window, the keys' documents) are not visited.
    INFO("block " << n << " visits [" << r.begin << ", " << r.end << ")");
    if (last_seen < 0) {
      REQUIRE(r.begin == r.end);
    } else {
      REQUIRE(r.begin == first_seen);
      REQUIRE(r.end == last_seen + 1);
    }
    if (n > 0) {
      REQUIRE(ranges[size_t(n - 1)].begin <= r.begin);
      REQUIRE(ranges[size_t(n - 1)].end <= r.end);
    }
  }
  for (int m = 0; m < n_tiles; ++m) {
    std::vector<int> visitors;
    for (int n = 0; n < n_blocks; ++n)
      if (ranges[size_t(n)].begin <= m && m < ranges[size_t(n)].end) visitors.push_back(n);
    if (visitors.empty()) continue;
    INFO("tile " << m);
    // A run of consecutive blocks, starting where the search says.
    REQUIRE(visitors.back() - visitors.front() + 1 == int(visitors.size()));
    REQUIRE(flash_tiles::last_key_block_of_tile(t, m, n_blocks) == visitors.back());
  }
}

}  // namespace

TEST_CASE("attention backward tiles: the kernels' cases", "[attention][tiles]") {
  // The shapes of tests/gpu/test_cuda_flash_attention_sm90.cpp and their windows, with the
  // sm90 backward's blocks (64 query rows, 128 keys).
  struct Case {
    int q_len, kv_len, offset, window;
  };
  const Case cases[] = {{2048, 2048, 0, 0},   {333, 333, 0, 0},   {150, 260, 110, 0},
                        {300, 1100, 800, 0},  {190, 130, -70, 0}, {1, 1, 0, 0},
                        {4096, 4096, 0, 300}, {333, 333, 0, 64},  {300, 1100, 800, 129},
                        {190, 130, -70, 7},   {64, 64, 0, 1},     {128, 4096, 3968, 200}};
  for (const Case& c : cases)
    for (const auto& [bm, bn] : {std::pair{64, 128}, std::pair{64, 64}, std::pair{128, 128}})
      check_tiling({c.q_len, c.kv_len, c.offset, c.window, bm, bn});
}

TEST_CASE("attention backward tiles: random shapes, offsets and windows", "[attention][tiles]") {
  std::mt19937 rng(20261203);
  auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 3000; ++trial) {
    const int q_len = draw(1, 700), kv_len = draw(1, 700);
    // The kernels' Params clamp the offset to [-q_len - 1, kv_len].
    const int offset = draw(-q_len - 1, kv_len);
    const int window = draw(0, 3) == 0 ? 0 : draw(1, q_len + kv_len);
    const int bm = draw(0, 1) ? 64 : 16, bn = draw(0, 1) ? 128 : 32;
    check_tiling({q_len, kv_len, offset, window, bm, bn});
  }
}

namespace {

// t with documents cut at `cuts`, its key rows from key_position0 (the tiling's query_position0
// = key_position0 + its causal_offset, as the kernels' Params have it).
void check_with_documents(BackwardTiling t, const std::vector<int>& cuts, int64_t key_position0) {
  const int64_t first = std::min<int64_t>(key_position0, key_position0 + t.causal_offset);
  REQUIRE(first >= 0);
  const int length = static_cast<int>(
      std::max<int64_t>(key_position0 + t.kv_len, key_position0 + t.causal_offset + t.q_len));
  const Documents docs =
      documents_at(cuts, length, t.q_len, t.kv_len, key_position0, t.causal_offset);
  t.key_doc_end = docs.key_doc_end.data();
  t.query_position0 = key_position0 + t.causal_offset;
  check_tiling(t, &docs);
}

}  // namespace

TEST_CASE("attention backward tiles: packed documents", "[attention][tiles]") {
  // One-token documents, documents across tile boundaries, one filling the window, with and
  // without a window, and a ring's block pair (keys from position 1000, queries after them).
  const std::vector<int> mixed = {1, 2, 3, 64, 65, 200, 201, 333, 700, 1200, 1201, 1500};
  std::vector<int> ones;
  for (int pos = 1; pos < 400; ++pos) ones.push_back(pos);
  for (const auto& [bm, bn] : {std::pair{64, 128}, std::pair{64, 64}, std::pair{128, 128}}) {
    check_with_documents({700, 700, 0, 0, bm, bn}, mixed, 0);
    check_with_documents({700, 700, 0, 100, bm, bn}, mixed, 0);
    check_with_documents({399, 399, 0, 0, bm, bn}, ones, 0);
    check_with_documents({512, 512, 0, 0, bm, bn}, {}, 0);                    // one document
    check_with_documents({300, 260, 240, 0, bm, bn}, mixed, 1000);            // ring: q after k
    check_with_documents({300, 260, 240, 90, bm, bn}, mixed, 1000);           // ring and window
    check_with_documents({200, 500, -300, 0, bm, bn}, {100, 250, 640}, 400);  // q before k
    check_with_documents({128, 256, 256, 0, bm, bn}, {10, 300, 380}, 0);      // ring: all behind
  }
}

TEST_CASE("attention backward tiles: random packed documents", "[attention][tiles]") {
  std::mt19937 rng(20261207);
  auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 2000; ++trial) {
    const int q_len = draw(1, 600), kv_len = draw(1, 600);
    // A ring's block pairs: keys from key_position0, queries from key_position0 + offset (in
    // the Params' clamped range, so that the tiling's offset is the caller's).
    const int offset = draw(-q_len - 1, kv_len);
    const int64_t key_position0 = draw(0, 3) == 0 ? std::max(0, -offset) : draw(q_len + 1, 2000);
    const int window = draw(0, 2) == 0 ? draw(1, q_len + kv_len) : 0;
    const int bm = draw(0, 1) ? 64 : 16, bn = draw(0, 1) ? 128 : 32;
    const int length = static_cast<int>(key_position0) + q_len + kv_len + 2;
    check_with_documents({q_len, kv_len, offset, window, bm, bn},
                         random_cuts(rng, length, draw(1, 300)), key_position0);
  }
}
