// The order in which the Hopper attention kernels (flash_attention_sm90*.cu) take their work
// items, shared by the kernels, their launchers and the CPU unit test.
//
// Each (batch, head) pair has the same number of work items (blocks of query rows, or of keys),
// rank 0 its longest. Pairs go in groups of `pairs_per_group`, each group's items longest first
// with its pairs inner. Then the items that run at one time belong to few heads and read the
// same tiles (K and V in the forward and dQ passes, Q and dO in the dK/dV pass) from L2 rather
// than HBM: with every head's items of one rank together, the first order these kernels had,
// an H200 read most tiles from HBM and the forward at 2k-4k tokens (head dim 128, no GQA) ran
// at its bandwidth's limit. One group of all pairs is that first order: longest first over
// everything, which evens the SMs' loads best, and is kept where every head's shared tiles fit
// in L2 anyway (GQA's heads share theirs). Smaller groups start a later group's long items while
// an earlier group's short ones run, which can leave SMs idle at the end: where that matters
// (few items per SM) choose_pairs_per_group finds it by simulating the hand-out.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

#include "kernels/host_device.h"

namespace frugal::work_order {

struct HeadGroupedOrder {
  int pairs, items_per_pair, pairs_per_group;
  // Blocks of each pair below the order's items (taken by another launch): the order's rank 0 is
  // block blocks_below + items_per_pair - 1 from the sequence's start.
  int blocks_below = 0;

  // Item i as its pair and rank.
  FRUGAL_HOST_DEVICE void at(int i, int& pair, int& rank) const {
    const int group_items = pairs_per_group * items_per_pair;
    const int first = i / group_items * pairs_per_group, j = i % group_items;
    const int left = pairs - first;  // the last group may be short
    const int in_group = pairs_per_group < left ? pairs_per_group : left;
    pair = first + j % in_group;
    rank = j / in_group;
  }
  // The query (or key) block, counted from the sequence's start, of the order's rank.
  FRUGAL_HOST_DEVICE int block_of_rank(int rank) const {
    return blocks_below + items_per_pair - 1 - rank;
  }
};

// The hardware's hand-out of a grid's blocks: each item of `order` in turn goes to the SM that
// frees first, the SMs free at `free_at` to begin with, rank r costing
// cost_of_rank[first_rank + r] + block_start. When the last SM finishes (no earlier than the
// latest of `free_at`).
inline double handed_out_end(std::vector<double> free_at, const HeadGroupedOrder& order,
                             const std::vector<double>& cost_of_rank, int first_rank = 0,
                             double block_start = 0.0) {
  double end = 0.0;
  for (double e : free_at) end = std::max(end, e);
  std::priority_queue<double, std::vector<double>, std::greater<>> queue(std::greater<>{},
                                                                         std::move(free_at));
  const int64_t items = int64_t{order.pairs} * order.items_per_pair;
  for (int64_t i = 0; i < items; ++i) {
    int pair = 0, rank = 0;
    order.at(static_cast<int>(i), pair, rank);
    const double done = queue.top() + cost_of_rank[first_rank + rank] + block_start;
    queue.pop();
    queue.push(done);
    end = std::max(end, done);
  }
  return end;
}

// When the last of `sms` SMs finishes if each takes the next item in `order` as it becomes free
// (as the hardware hands out a grid's blocks), item costs by rank. In the same unit as the costs.
inline double simulated_makespan(const HeadGroupedOrder& order,
                                 const std::vector<double>& cost_of_rank, int sms) {
  return handed_out_end(std::vector<double>(static_cast<size_t>(sms), 0.0), order, cost_of_rank);
}

// The persistent walk (flash_attention_sm90.cuh's item_of_round): `blocks` blocks take the
// order's items in rounds of `blocks`, even rounds forwards and odd ones backwards. When each
// block finishes, item costs by rank.
inline std::vector<double> walk_ends(const HeadGroupedOrder& order,
                                     const std::vector<double>& cost_of_rank, int blocks) {
  std::vector<double> end(static_cast<size_t>(blocks), 0.0);
  const int64_t items = int64_t{order.pairs} * order.items_per_pair;
  for (int64_t i = 0; i < items; ++i) {
    const int64_t round = i / blocks, slot = i % blocks;
    int pair = 0, rank = 0;
    order.at(static_cast<int>(i), pair, rank);
    end[static_cast<size_t>(round % 2 == 0 ? slot : blocks - 1 - slot)] += cost_of_rank[rank];
  }
  return end;
}

// A walk in two launches: persistent blocks (one per SM, or per item if fewer) walk the longer
// items of every pair (HeadGroupedOrder with `walk_group` pairs a group), then a block per item
// takes the `tail_ranks` shortest of every pair, longest first over all pairs, each on the SM
// that frees first (the hardware hands out the tail's blocks as the walkers finish), its start
// costing `block_start` more. Item costs by rank over all of a pair's items (rank 0 the
// longest); tail_ranks 0 is the walk alone.
inline double walk_then_tail_makespan(int pairs, const std::vector<double>& cost_of_rank,
                                      int walk_group, int tail_ranks, int sms, double block_start) {
  const int items_per_pair = static_cast<int>(cost_of_rank.size());
  const int walked = items_per_pair - tail_ranks;
  const HeadGroupedOrder walk{pairs, walked, walk_group, tail_ranks};
  const int blocks = static_cast<int>(std::min<int64_t>(sms, int64_t{pairs} * walked));
  std::vector<double> free_at = walk_ends(walk, cost_of_rank, blocks);
  free_at.resize(static_cast<size_t>(sms), 0.0);  // the SMs no walker took
  return handed_out_end(std::move(free_at), HeadGroupedOrder{pairs, tail_ranks, pairs},
                        cost_of_rank, walked, block_start);
}

// How many of each pair's shortest items a persistent walk leaves to a tail of a block per item
// (walk_then_tail_makespan), items costing their tiles plus one: the count whose simulated end
// is the earliest, 0 (no tail) unless that ends at least kMinTailGain earlier than the walk alone.
constexpr double kMinTailGain = 0.005;
inline int choose_tail_ranks(int pairs, const std::vector<int>& tiles_of_rank, int walk_group,
                             int sms, double block_start) {
  std::vector<double> cost;
  for (int t : tiles_of_rank) cost.push_back(t + 1.0);
  const int items_per_pair = static_cast<int>(cost.size());
  if (pairs <= 0 || sms <= 0 || int64_t{pairs} * items_per_pair <= sms) return 0;
  const double alone = walk_then_tail_makespan(pairs, cost, walk_group, 0, sms, block_start);
  int best = 0;
  double best_end = alone;
  for (int tail = 1; tail < items_per_pair; ++tail) {
    const double end = walk_then_tail_makespan(pairs, cost, walk_group, tail, sms, block_start);
    if (end < best_end) best = tail, best_end = end;
  }
  return best_end <= (1.0 - kMinTailGain) * alone ? best : 0;
}

// Grids of fewer items than this per SM keep all pairs together: there the simulation's costs
// (tiles plus one) were too rough to beat longest first over everything (the dK/dV pass at 8k
// tokens, GQA 8:1, 256 blocks: one kv head at a time measured 2 % slower on an H200).
constexpr int kMinItemsPerSm = 8;

// The group size for a grid of `pairs` pairs whose items cost `tiles_of_rank` tiles each (by
// rank), a pair's items sharing `shared_bytes_per_pair` bytes of tiles, on `sms` SMs with
// `l2_bytes` of L2. All pairs when all their shared tiles fit in half the L2, or when the grid
// has few items (kMinItemsPerSm). Otherwise the smallest group whose simulated end is within
// 1 % of the best of the sizes tried: groups whose shared tiles fit in half the L2, and all
// pairs. An item's cost is its tiles plus one (its start and its end). Where the longest item
// is under 1 % of an SM's share, any order ends within 1 % of the ideal (a greedy hand-out ends
// by the mean load plus the longest item), so that is not simulated: it takes the smallest
// group that gives every SM an item; nor are grids beyond 2^17 items (the simulation's cost).
inline int choose_pairs_per_group(int pairs, const std::vector<int>& tiles_of_rank,
                                  int64_t shared_bytes_per_pair, int sms, int64_t l2_bytes) {
  const int items_per_pair = static_cast<int>(tiles_of_rank.size());
  if (pairs <= 1 || items_per_pair == 0 || sms <= 0) return std::max(pairs, 1);
  const int64_t fit_l2 = l2_bytes / 2 / std::max<int64_t>(shared_bytes_per_pair, 1);
  if (fit_l2 >= pairs || int64_t{pairs} * items_per_pair < int64_t{kMinItemsPerSm} * sms)
    return pairs;
  const int most = static_cast<int>(std::clamp<int64_t>(fit_l2, 1, pairs));
  std::vector<double> cost(tiles_of_rank.begin(), tiles_of_rank.end());
  double total = 0.0, longest = 0.0;
  for (double& c : cost) {
    c += 1.0;
    total += c * pairs;
    longest = std::max(longest, c);
  }
  const int for_sms = std::min(most, (sms + items_per_pair - 1) / items_per_pair);
  if (longest <= 0.01 * total / sms || int64_t{pairs} * items_per_pair > (int64_t{1} << 17))
    return for_sms;

  std::vector<int> tried;
  for (int g = 1; g < most; g = std::max(g + 1, g * 5 / 4)) tried.push_back(g);
  tried.push_back(most);
  if (most < pairs) tried.push_back(pairs);
  std::vector<double> ends;
  for (int g : tried) ends.push_back(simulated_makespan({pairs, items_per_pair, g}, cost, sms));
  const double best = *std::min_element(ends.begin(), ends.end());
  for (size_t k = 0; k < tried.size(); ++k)
    if (ends[k] <= 1.01 * best) return tried[k];
  return pairs;
}

}  // namespace frugal::work_order
