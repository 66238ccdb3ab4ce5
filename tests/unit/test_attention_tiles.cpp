// The Hopper attention backward's tiling (kernels/attention_backward_tiles.h) against brute
// force over the mask itself (cpu::visible_keys): every (row, key) pair the mask shows is in a
// tile its key block visits, the ranges never move back as the block index grows (so the
// blocks adding to one tile are a run), and the last block of each tile is the last that
// visits it. A block waiting for a count that no run reaches would hang the GPU kernel; one
// adding out of turn would make dQ's bits depend on timing.
#include <algorithm>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "kernels/attention_backward_tiles.h"
#include "kernels/cpu/attention.h"

using namespace frugal;
using flash_tiles::BackwardTiling;

namespace {

void check_tiling(const BackwardTiling& t) {
  INFO("q_len " << t.q_len << " kv_len " << t.kv_len << " offset " << t.causal_offset << " window "
                << t.window << " block_m " << t.block_m << " block_n " << t.block_n);
  cpu::AttentionShape s;
  s.q_len = t.q_len;
  s.kv_len = t.kv_len;
  s.causal_offset = t.causal_offset;
  s.window = t.window;
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
    for (int m = 0; m < n_tiles; ++m)
      if (sees[size_t(n)][size_t(m)]) {
        INFO("block " << n << " tile " << m);
        REQUIRE(r.begin <= m);
        REQUIRE(m < r.end);
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
