// The Hopper attention kernels' work order (kernels/head_grouped_order.h): every item is taken
// exactly once, a group's items go longest first with its pairs inner, the simulated hand-out
// matches a second, plain implementation (each item to the SM that frees first, found by a
// scan), and the group size chosen never ends more than 1 % after the order of all pairs
// together while keeping within its L2 budget. A lost or repeated item would leave rows of the
// attention unwritten or written twice.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "catch_compat.h"
#include "kernels/head_grouped_order.h"

using frugal::work_order::choose_pairs_per_group;
using frugal::work_order::HeadGroupedOrder;
using frugal::work_order::simulated_makespan;

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
    std::vector<double> cost;
    for (int r = 0; r < items; ++r) cost.push_back(1.0 + static_cast<double>(rng() % 17));
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
