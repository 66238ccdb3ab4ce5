// The Hopper attention kernels' work order (kernels/head_grouped_order.h): every item is taken
// exactly once, a group's items go longest first with its pairs inner, the simulated hand-out
// matches a second, plain implementation (each item to the SM that frees first, found by a
// scan), and the group size chosen never ends more than 1 % after the order of all pairs
// together while keeping within its L2 budget; a persistent walk and its tail (the forward's two
// launches) take every block once between them, their simulation matches a block-by-block walk
// and a scan, and the tail chosen is the one that simulates earliest, or none. A lost or
// repeated item would leave rows of the attention unwritten or written twice.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "catch_compat.h"
#include "kernels/head_grouped_order.h"

using frugal::work_order::choose_pairs_per_group;
using frugal::work_order::choose_tail_ranks;
using frugal::work_order::HeadGroupedOrder;
using frugal::work_order::simulated_makespan;
using frugal::work_order::walk_ends;
using frugal::work_order::walk_then_tail_makespan;

namespace {

// The end of the hand-out by a scan over the SMs' free times (the first free SM, lowest index on
// ties, takes the next item).
double makespan_by_scan(int pairs, int items_per_pair, int group, const std::vector<double>& cost,
                        int sms) {
  std::vector<double> free_at(static_cast<size_t>(sms), 0.0);
  for (int first = 0; first < pairs; first += group) {
    const int in_group = std::min(group, pairs - first);
    for (int rank = 0; rank < items_per_pair; ++rank)
      for (int k = 0; k < in_group; ++k) {
        auto sm = std::min_element(free_at.begin(), free_at.end());
        *sm += cost[static_cast<size_t>(rank)];
      }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

// Item costs by rank for the randomized cases: 1 to 17 each, drawn from rng.
std::vector<double> random_costs(std::mt19937& rng, int items) {
  std::vector<double> cost;
  for (int r = 0; r < items; ++r) cost.push_back(1.0 + static_cast<double>(rng() % 17));
  return cost;
}

std::vector<double> costs_of(const std::vector<int>& tiles) {
  std::vector<double> cost;
  for (int t : tiles) cost.push_back(t + 1.0);
  return cost;
}

// Causal tiles by rank: rank 0 the longest (n tiles), each next one step shorter.
std::vector<int> causal_tiles(int n, int step) {
  std::vector<int> tiles;
  for (int rank = 0; rank < n; ++rank) tiles.push_back(step * (n - rank));
  return tiles;
}

// Each block's end under the persistent walk, block by block: block b takes the item of slot b
// (even rounds) or blocks - 1 - b (odd ones) of every round while there is one.
std::vector<double> walk_ends_by_block(const HeadGroupedOrder& order,
                                       const std::vector<double>& cost, int blocks) {
  const int items = order.pairs * order.items_per_pair;
  std::vector<double> end;
  for (int b = 0; b < blocks; ++b) {
    double t = 0.0;
    for (int round = 0;; ++round) {
      const int item = round * blocks + (round % 2 == 0 ? b : blocks - 1 - b);
      if (item >= items) break;
      int pair = 0, rank = 0;
      order.at(item, pair, rank);
      t += cost[static_cast<size_t>(rank)];
    }
    end.push_back(t);
  }
  return end;
}

// walk_then_tail_makespan by a second route: the walk block by block, then the tail's items
// (the shortest ranks, longest first over all pairs) each to the SM that frees first by a scan.
double walk_then_tail_by_scan(int pairs, const std::vector<double>& cost, int group, int tail,
                              int sms, double start) {
  const int items = static_cast<int>(cost.size()), walked = items - tail;
  const int blocks = std::min(sms, pairs * walked);
  std::vector<double> free_at = walk_ends_by_block({pairs, walked, group, tail}, cost, blocks);
  free_at.resize(static_cast<size_t>(sms), 0.0);
  double end = *std::max_element(free_at.begin(), free_at.end());
  for (int rank = walked; rank < items; ++rank)
    for (int pair = 0; pair < pairs; ++pair) {
      auto sm = std::min_element(free_at.begin(), free_at.end());
      *sm += cost[static_cast<size_t>(rank)] + start;
      end = std::max(end, *sm);
    }
  return end;
}

}  // namespace

TEST_CASE("the grouped order takes every item once, longest first within a group") {
  for (const auto& [pairs, items, group] : std::vector<std::tuple<int, int, int>>{
           {1, 1, 1}, {7, 5, 3}, {16, 16, 6}, {256, 16, 9}, {5, 32, 5}, {12, 4, 100}}) {
    INFO("pairs " << pairs << " items " << items << " group " << group);
    const HeadGroupedOrder order{pairs, items, std::min(group, pairs)};
    std::set<std::pair<int, int>> seen;
    int last_group_first = 0, last_rank = 0;
    for (int i = 0; i < pairs * items; ++i) {
      int pair = -1, rank = -1;
      order.at(i, pair, rank);
      REQUIRE(pair >= 0);
      REQUIRE(pair < pairs);
      REQUIRE(rank >= 0);
      REQUIRE(rank < items);
      REQUIRE(seen.insert({pair, rank}).second);
      const int group_first = pair / order.pairs_per_group * order.pairs_per_group;
      if (group_first == last_group_first)
        CHECK(rank >= last_rank);  // within a group, ranks never go back
      else
        CHECK(group_first > last_group_first);  // groups in order, each whole
      last_group_first = group_first;
      last_rank = rank;
    }
    CHECK(seen.size() == static_cast<size_t>(pairs * items));
  }
}

TEST_CASE("the simulated hand-out agrees with a scan over the SMs") {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 40; ++trial) {
    const int pairs = 1 + static_cast<int>(rng() % 40), items = 1 + static_cast<int>(rng() % 20);
    const int group = 1 + static_cast<int>(rng() % pairs), sms = 1 + static_cast<int>(rng() % 50);
    const std::vector<double> cost = random_costs(rng, items);
    INFO("pairs " << pairs << " items " << items << " group " << group << " sms " << sms);
    CHECK(simulated_makespan({pairs, items, group}, cost, sms) ==
          Approx(makespan_by_scan(pairs, items, group, cost, sms)));
  }
  // By hand: 2 SMs, 2 pairs of items costing 3 then 1. All pairs: 3, 3, 1, 1 -> both end at 4.
  // One pair at a time: 3, 1, 3, 1 -> SM 1 takes 1 then 3 (ends 4), SM 0 3 then 1 (4).
  CHECK(simulated_makespan({2, 2, 2}, {3.0, 1.0}, 2) == 4.0);
  CHECK(simulated_makespan({2, 2, 1}, {3.0, 1.0}, 2) == 4.0);
  // 2 SMs, 3 pairs of (4, 1). All pairs: 4, 4, 4, 1, 1, 1 -> the third 4 starts at 4, ends 8.
  // One pair at a time: 4, 1, 4, 1, 4, 1 -> SM 1 takes 1 then 4 (5), SM 0 4 then 1 (5), then
  // the last 4 starts at 5 and ends at 9: the later group's long item starts late.
  CHECK(simulated_makespan({3, 2, 3}, {4.0, 1.0}, 2) == 8.0);
  CHECK(simulated_makespan({3, 2, 1}, {4.0, 1.0}, 2) == 9.0);
}

TEST_CASE("the chosen group ends within 1 % of all pairs together and respects the L2 budget") {
  const int sms = 132;
  const int64_t l2 = int64_t{50} << 20;
  struct Case {
    int pairs;
    std::vector<int> tiles;
    int64_t shared_bytes;
  };
  const std::vector<Case> cases{
      {256, causal_tiles(16, 1), int64_t{1} << 20},    // 2k tokens, head dim 128: fwd / dQ
      {128, causal_tiles(32, 1), int64_t{2} << 20},    // 4k tokens
      {32, causal_tiles(128, 1), int64_t{8} << 20},    // 16k tokens, block per item
      {16, causal_tiles(16, 16), int64_t{4} << 20},    // TinyLlama's dK/dV: few long items
      {4, causal_tiles(64, 16), int64_t{16} << 20},    // 8k GQA 8:1 dK/dV
      {128, causal_tiles(16, 1), int64_t{64} << 10},   // TinyLlama's fwd / dQ: fits in L2
      {1000, causal_tiles(3, 1), int64_t{100} << 20},  // every pair over the budget
      {4096, causal_tiles(16, 1), int64_t{1} << 20},   // many items: chosen unsimulated
  };
  for (const Case& c : cases) {
    INFO("pairs " << c.pairs << " items " << c.tiles.size() << " shared " << c.shared_bytes);
    const int group = choose_pairs_per_group(c.pairs, c.tiles, c.shared_bytes, sms, l2);
    REQUIRE(group >= 1);
    REQUIRE(group <= c.pairs);
    const int items = static_cast<int>(c.tiles.size());
    const std::vector<double> cost = costs_of(c.tiles);
    const double all_pairs = makespan_by_scan(c.pairs, items, c.pairs, cost, sms);
    CHECK(makespan_by_scan(c.pairs, items, group, cost, sms) <= 1.01 * all_pairs + 1e-9);
    if (int64_t{c.pairs} * c.shared_bytes <= l2 / 2)
      CHECK(group == c.pairs);  // everything fits: the old order, best balanced
    else
      CHECK((group == c.pairs || int64_t{group} * c.shared_bytes <= l2 / 2 || group == 1));
  }
  // Where items are many and the budget tight, grouping does happen (the point of the order):
  // 2k tokens at head dim 128, 1 MiB of K and V per head.
  const int group = choose_pairs_per_group(256, causal_tiles(16, 1), int64_t{1} << 20, sms, l2);
  CHECK(group < 256);
  CHECK(int64_t{group} << 20 <= l2 / 2);
}

TEST_CASE("a walk and its tail take every block of every pair once") {
  // The walk's order leaves the `tail` first blocks of each pair below its items; the tail's
  // order takes exactly those (the forward's two launches, query_grid).
  for (const auto& [pairs, items, group, tail] : std::vector<std::tuple<int, int, int, int>>{
           {256, 16, 1, 1}, {128, 32, 1, 4}, {128, 11, 128, 1}, {7, 5, 3, 2}, {3, 4, 1, 3}}) {
    INFO("pairs " << pairs << " items " << items << " group " << group << " tail " << tail);
    const HeadGroupedOrder walk{pairs, items - tail, group, tail};
    const HeadGroupedOrder rest{pairs, tail, pairs};
    std::set<std::pair<int, int>> seen;
    for (const bool walked : {true, false}) {
      const HeadGroupedOrder& order = walked ? walk : rest;
      for (int i = 0; i < order.pairs * order.items_per_pair; ++i) {
        int pair = -1, rank = -1;
        order.at(i, pair, rank);
        const int block = order.block_of_rank(rank);
        REQUIRE(block >= 0);
        REQUIRE(block < items);
        REQUIRE(seen.insert({pair, block}).second);
        // The walk holds the longer blocks (the later ones under the causal mask).
        CHECK(walked == (block >= tail));
      }
    }
    CHECK(seen.size() == static_cast<size_t>(pairs * items));
  }
}

TEST_CASE("the simulated walk and tail agree with a block-by-block walk and a scan") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 40; ++trial) {
    const int pairs = 1 + static_cast<int>(rng() % 40), items = 2 + static_cast<int>(rng() % 20);
    const int group = 1 + static_cast<int>(rng() % pairs), sms = 1 + static_cast<int>(rng() % 50);
    const int tail = static_cast<int>(rng() % items);
    const double start = 0.25 * static_cast<double>(rng() % 5);
    const std::vector<double> cost = random_costs(rng, items);
    INFO("pairs " << pairs << " items " << items << " group " << group << " sms " << sms << " tail "
                  << tail << " start " << start);
    const HeadGroupedOrder whole{pairs, items, group};
    const int blocks = std::min(sms, pairs * items);
    const std::vector<double> ends = walk_ends(whole, cost, blocks);
    const std::vector<double> by_block = walk_ends_by_block(whole, cost, blocks);
    REQUIRE(ends.size() == by_block.size());
    for (size_t b = 0; b < ends.size(); ++b) CHECK(ends[b] == Approx(by_block[b]));
    CHECK(walk_then_tail_makespan(pairs, cost, group, tail, sms, start) ==
          Approx(walk_then_tail_by_scan(pairs, cost, group, tail, sms, start)));
  }
  // By hand: 2 blocks, 1 pair of 4 items costing 4, 3, 2, 1. The walk: round 0 gives block 0
  // the 4 and block 1 the 3, round 1 (backwards) block 1 the 2 and block 0 the 1: both end at 5.
  CHECK(walk_ends({1, 4, 1}, {4.0, 3.0, 2.0, 1.0}, 2) == std::vector<double>{5.0, 5.0});
  // 2 SMs, the walk of the first 3 (4 | 3 then 2: ends 4 and 5), the 1 as a tail starting at 4
  // plus its start of 0.5: ends 5.5.
  CHECK(walk_then_tail_makespan(1, {4.0, 3.0, 2.0, 1.0}, 1, 1, 2, 0.5) == 5.5);
}

TEST_CASE("the tail chosen ends earliest, and no later than the walk alone") {
  const int sms = 132;
  // Causal forwards at head dim 128 (a tile per query block more), and one with more SMs than
  // items.
  for (const auto& [pairs, blocks, group, start] :
       std::vector<std::tuple<int, int, int, double>>{{256, 16, 1, 1.0},
                                                      {128, 32, 1, 1.0},
                                                      {128, 11, 128, 0.5},
                                                      {40, 9, 1, 1.0},
                                                      {16, 16, 1, 1.0},
                                                      {4, 16, 1, 1.0}}) {
    INFO("pairs " << pairs << " blocks " << blocks << " group " << group);
    const std::vector<int> tiles = causal_tiles(blocks, 1);
    const int tail = choose_tail_ranks(pairs, tiles, group, sms, start);
    REQUIRE(tail >= 0);
    REQUIRE(tail < blocks);
    const std::vector<double> cost = costs_of(tiles);
    const double alone = walk_then_tail_by_scan(pairs, cost, group, 0, sms, start);
    const double chosen = walk_then_tail_by_scan(pairs, cost, group, tail, sms, start);
    CHECK(chosen <= alone + 1e-9);
    double best = alone;
    for (int t = 1; t < blocks; ++t)
      best = std::min(best, walk_then_tail_by_scan(pairs, cost, group, t, sms, start));
    if (tail > 0) {
      CHECK(chosen == Approx(best));
      CHECK(chosen <= (1.0 - frugal::work_order::kMinTailGain) * alone + 1e-9);
    } else {
      CHECK(best > (1.0 - frugal::work_order::kMinTailGain) * alone);
    }
    if (pairs * blocks <= sms) CHECK(tail == 0);  // one round: nothing to even out
  }
}
