// The Hopper attention forward (the outline is in flash_attention_sm90.cu, the instructions in
// flash_attention_sm90.cuh).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_sm90.cuh"
#include "kernels/cuda/flash_attention_sm90.h"

namespace frugal::cuda {

namespace {

using namespace sm90;

// ---- forward ---------------------------------------------------------------------------------

constexpr int kFwdBlockN = 128, kHalfN = kFwdBlockN / 2;
// Consumer warpgroups of the forward, 64 query rows each: three at head dim 64 (FlashAttention-3's
// choice there), where S and P V are short products and a consumer's softmax is as long as its
// products: with two, the SMs' schedulers were idle 59 % of the time waiting on the softmax's
// dependencies (ncu, H200, TinyLlama's shape). Two at 128, whose O takes twice the registers.
constexpr int forward_consumers(int d) { return d == 64 ? 3 : 2; }
constexpr int forward_block_rows(int d) { return kRowsPerConsumer * forward_consumers(d); }
constexpr int forward_threads(int d) { return kWarpgroupThreads * (1 + forward_consumers(d)); }
// Registers per consumer thread after setmaxnreg (the producer keeps kProducerRegisters): with
// three consumers 128 x 24 + 384 x 160 = 64,512 of the 65,536.
constexpr int forward_consumer_registers(int d) {
  return forward_consumers(d) == 3 ? 160 : kConsumerRegisters;
}
// How out leaves at head dim 128: through shared memory and the copy engine
// (write_output_rows_staged, staged in the item's last K tile once every consumer's last S has
// read it) rather than in 4-byte stores from the registers, which took the forwards at 2k-4k
// tokens 1-1.5 % faster (H200). At 64 the quad stores stay: staged in a buffer of their own, the
// forwards went 12-15 % slower (the stores' issuing thread waited for them to read the buffer,
// and its warpgroup's products with it).
template <int D>
constexpr bool kStagedOutput = D == 128;
// Whether the forward takes half tiles (below) on the diagonal: at head dim 128 only; at 64 they
// measured slower (TinyLlama's forward 2-4 %), where S takes half as long and the kernel's code
// grows by half.
template <int D>
constexpr bool kForwardHalfTiles = D == 128;

// Shared memory of the forward, as byte offsets from a 1024-byte aligned base: Q, then kStages
// (K, V) stages, then the barriers (Q loaded; per stage full and empty; Q free again).
template <int D, int kStages>
struct ForwardSmem {
  static constexpr int kQ = 0;
  static constexpr int kKv = kQ + tile_bytes(forward_block_rows(D), D);
  static constexpr int kTileBytes = tile_bytes(kFwdBlockN, D);
  static constexpr int kStageBytes = 2 * kTileBytes;  // K then V
  static constexpr int kBarriers = kKv + kStages * kStageBytes;
  static constexpr int kQEmpty = kBarriers + 8 * (1 + 2 * kStages);
  static constexpr int kBytes = kQEmpty + 8;
  static constexpr int kLaunchBytes = kBytes + kSwizzlePeriodBytes;  // slack to align the base
};

template <int D, int kStages>
__global__ void __launch_bounds__(forward_threads(D), 1)
    flash_sm90_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                              const __grid_constant__ CUtensorMap q_map,
                              const __grid_constant__ CUtensorMap k_map,
                              const __grid_constant__ CUtensorMap v_map,
                              const __grid_constant__ CUtensorMap out_map, const Params p,
                              const HeadGroupedOrder order) {
#if FRUGAL_SM90_DEVICE_CODE
  using Smem = ForwardSmem<D, kStages>;
  constexpr int kBlockM = forward_block_rows(D), kBlockN = kFwdBlockN;
  constexpr int kConsumerThreadCount = forward_consumers(D) * kWarpgroupThreads;
  constexpr bool kSkipHiddenTiles = forward_consumers(D) == 3;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = swizzle_aligned(smem_raw);
  const int n_work = order.pairs * order.items_per_pair;
  auto work_at = [&](int i) { return query_item<kBlockM, kBlockN, true>(order, p, i); };

  const uint32_t sq = base + Smem::kQ, q_full = base + Smem::kBarriers;
  const uint32_t q_empty = base + Smem::kQEmpty;
  const StageBarriers<kStages> bars{q_full};
  auto k_tile = [&](int stage) { return base + Smem::kKv + stage * Smem::kStageBytes; };
  auto v_tile = [&](int stage) { return k_tile(stage) + Smem::kTileBytes; };
  if (threadIdx.x == 0) mbarrier_init(q_empty, kConsumerThreadCount);  // bars.init fences, syncs
  bars.init(1, kConsumerThreadCount);

  // Producer and consumers walk the same items; K/V tiles go round the stages across items
  // (`loaded` counts them), and Q is reloaded once every consumer's last S of an item has read it
  // (q_empty), so the next item's loads overlap this one's epilogue.
  if (threadIdx.x < kWarpgroupThreads) {  // producer
    registers_decrease<kProducerRegisters>();
    if (threadIdx.x == 0) {
      let_next_grid_start();  // a tail (launch_tail) may take the SMs this walk leaves
      int loaded = 0, items = 0;
      for (int round = 0, i; (i = item_of_round(round)) < n_work; ++round) {
        const QueryItem w = work_at(i);
        if (w.n_tiles == 0) continue;
        mbarrier_wait(q_empty, (items & 1) ^ 1);
        mbarrier_arrive_expect_bytes(q_full, tile_bytes(kBlockM, D));
        tma_load_rows<D, kBlockM>(sq, &q_map, q_full, w.h, w.q0, w.b);
        load_kv_tiles<D, kBlockN>(bars, k_tile, v_tile, Smem::kStageBytes, &k_map, &v_map,
                                  w.h / p.group, w.b, w.kv_begin, w.n_tiles, loaded);
        if (const int after = item_of_round(round + 1); after < n_work) {
          const QueryItem w_after = work_at(after);
          tma_prefetch_rows<D, kBlockM>(&q_map, w_after.h, w_after.q0, w_after.b);
        }
        loaded += w.n_tiles;
        ++items;
      }
      // A tail's last block ends only after the walk before it, so that what follows the tail on
      // the stream (which waits for the tail alone) sees the walk's out and lse too.
      if (blockIdx.x == gridDim.x - 1) wait_for_grids_before();
    }
    return;
  }

  // Consumers: warpgroup c owns query rows [q0 + 64 c, q0 + 64 c + 64) of each item.
  registers_increase<forward_consumer_registers(D)>();
  // Broadcast from lane 0, so that ptxas sees it is the same across the warp (a uniform value:
  // branches on it, like the half tile's, then leave the wgmma pipeline intact, C7520).
  const int consumer = __shfl_sync(0xffffffffu, threadIdx.x / kWarpgroupThreads, 0) - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  // An item as this consumer sees it: its rows, the tiles [unmasked_begin, unmasked_end) of keys
  // every row of the block sees (and that exist: they need no mask), and its first tile's number
  // through the stage ring. (Tile numbers rather than keys: the keys need w.kv_begin, which with
  // packed documents comes from memory, and at head dim 128 kept live over the item it cost
  // ptxas the registers to pipeline the wgmmas, C7511, so the masked tiles work it out again;
  // at 64 working it out again took ptxas 8 more bytes of spills.)
  struct Item {
    QueryItem w;
    int row_a, row_b, unmasked_begin, unmasked_end, first_load;
    // The tiles this consumer multiplies, the item's first n_mine. With three consumers the last
    // ones none of its rows sees it only waits for and hands back (at most kStages - 2 of them,
    // which keeps the stage ring moving while it holds its last tile and waits for the next
    // item's first); with two there are none (consumer 0's last tile is a half tile at most),
    // and the check left ptxas serializing the head-dim-128 wgmmas (C7520).
    int mine;
    __device__ int n_mine() const { return kSkipHiddenTiles ? mine : w.n_tiles; }
    // Whether this consumer's rows see none of the last tile's second half (consumer 0 on the
    // diagonal): its S and P V there take 64 keys.
    bool last_tile_half;
    bf16* out_head;
    float* lse_head;
  };
  // The walk's next item with keys (Item::w.n_tiles == 0 once the walk is done). Items whose
  // rows see no key are written on the way (out = 0, lse = -inf): no tile is loaded for them.
  int round = 0, loaded = 0, items = 0;
  auto next_item = [&]() {
    Item it;
    it.w.n_tiles = 0;
    for (int i; (i = item_of_round(round)) < n_work;) {
      ++round;
      it.w = work_at(i);
      it.out_head = out + static_cast<int64_t>(it.w.b) * p.q_len * p.q_stride + it.w.h * D;
      it.lse_head = lse + (static_cast<int64_t>(it.w.b) * p.n_heads + it.w.h) * p.q_len;
      if (it.w.n_tiles == 0) {
        write_unseen_rows<D, kBlockM, kConsumerThreadCount>(it.out_head, it.lse_head, it.w.q0, p,
                                                            threadIdx.x - kWarpgroupThreads);
        continue;
      }
      it.row_a = it.w.q0 + consumer * kRowsPerConsumer + warp * 16 + lane / 4;
      it.row_b = it.row_a + 8;
      // Keys from unmasked_key_begin to unmasked_key_end every row sees, so the tiles wholly
      // inside; unmasked_key_begin >= kv_begin (the first row's first key is the lowest).
      const int unmasked_key_end = min(it.w.q0 + p.causal_offset + 1, p.kv_len) - it.w.kv_begin;
      const int unmasked_key_begin = first_key_of_row(it.w.b, it.w.last_row, p) - it.w.kv_begin;
      it.unmasked_begin = (unmasked_key_begin + kBlockN - 1) / kBlockN;
      it.unmasked_end = unmasked_key_end > 0 ? unmasked_key_end / kBlockN : 0;
      const int rows_begin = it.w.q0 + consumer * kRowsPerConsumer;
      if constexpr (kSkipHiddenTiles) {
        const int mine_end =
            keys_seen(min(rows_begin + kRowsPerConsumer, p.q_len) - 1, p) - it.w.kv_begin;
        const int mine = rows_begin >= p.q_len ? 1 : (mine_end + kBlockN - 1) / kBlockN;
        it.mine = max(max(mine, 1), it.w.n_tiles - (kStages - 2));
      }
      const int last_k0 = it.w.kv_begin + (it.n_mine() - 1) * kBlockN;
      it.last_tile_half =
          kForwardHalfTiles<D> && tile_hidden(rows_begin, rows_begin + kRowsPerConsumer,
                                              last_k0 + kHalfN, last_k0 + kBlockN, p);
      it.first_load = loaded;
      loaded += it.w.n_tiles;
      break;
    }
    return it;
  };

  // Q is read from shared memory until the item's last S, which hands its tile back. (Held in
  // registers for the item, as two consumers at head dim 64 had it, it made ptxas spill: 160
  // registers a consumer thread with three.)
  // Waits for the next item's Q (the `items`-th loaded).
  auto take_q = [&]() { mbarrier_wait(q_full, items & 1); };
  float s[kBlockN / 2], o[D / 2], row_max[2], row_sum[2], correction[2];
  // Whether the last softmax moved the warp's maxima, so O needs its correction (warp-uniform).
  bool rescale = true;
  uint32_t pa[kBlockN / 16][4];
  // A half tile (Item::last_tile_half) multiplies its first 64 keys only: S into the first half
  // of s (the same accumulator layout), whose second half the mask then sets to -inf, so P is 0
  // there; P V over those 64 keys. A quarter of the diagonal tile's products, which at 2k tokens
  // is an eighth of an item's tiles. Whether a product is a half tile's is a type (HalfTile or
  // FullTile) and each kind has a path of its own up to the wait for its product: where paths
  // with different products in flight met, ptxas serialized every wgmma of the kernel.
  using HalfTile = std::true_type;
  using FullTile = std::false_type;
  // Issues S = Q K_t^T of item `it` (64 rows x 128 keys per consumer, or 64 of a half tile) into
  // s, once tile t has landed.
  auto issue_scores = [&](const Item& it, int t, auto half) {
    const int stage = (it.first_load + t) % kStages;
    mbarrier_wait(bars.full(stage), ((it.first_load + t) / kStages) & 1);
    wgmma_fence();
    const uint32_t k = k_tile(stage);
    if constexpr (decltype(half)::value) {
      float(&s_half)[kHalfN / 2] = *reinterpret_cast<float(*)[kHalfN / 2]>(s);
      issue_product_ss<D, kBlockM, kHalfN, kBlockN>(s_half, sq, consumer * kRowsPerConsumer, k);
    } else {
      issue_product_ss<D, kBlockM, kBlockN>(s, sq, consumer * kRowsPerConsumer, k);
    }
  };
  // Once S has completed: a half tile's second half is all hidden (-inf). Set here, after the
  // product, so that s's old values there are dead while it runs (kept alive they cost ptxas the
  // registers to pipeline the wgmmas at head dim 64, C7511).
  auto scores_landed = [&](auto half) {
    if constexpr (decltype(half)::value) {
#pragma unroll
      for (int e = kHalfN / 2; e < kBlockN / 2; ++e) s[e] = -INFINITY;
    }
    pin_registers(s);
  };
  // O += P_t V_t (issued, not waited for).
  auto issue_pv = [&](const Item& it, int t, auto half) {
    const uint32_t v = v_tile((it.first_load + t) % kStages);
    wgmma_fence();
    pin_registers(o);
    pin_registers(pa);
    if constexpr (decltype(half)::value)
      issue_product_rs<D, kHalfN, kBlockN>(o, pa, v);
    else
      issue_product_rs<D, kBlockN>(o, pa, v);
  };
  // Online softmax of tile t of item `it`, rows in fp32 (a row's 128 scores are spread over the
  // 4 lanes of a quad): masks s, turns it into P relative to the row's kept maximum, adds P to
  // the row sum, and when the maxima move sets `rescale` and the factor that takes O from the old
  // maximum to the new one.
  auto softmax = [&](const Item& it, int t) {
    if (t >= it.unmasked_end || t < it.unmasked_begin) {
      const int kv_begin = D == 128 ? item_kv_begin<kBlockN>(it.w.b, it.w.q0, p) : it.w.kv_begin;
      const int k0 = kv_begin + t * kBlockN;
      // The rows' first keys (window, document) are worked out here, on the tiles that need
      // them: kept in the item, they cost ptxas the registers to pipeline the head-dim-128
      // wgmmas (C7511).
      const int first_a = first_key_of_row(it.w.b, it.row_a, p);
      const int first_b = first_key_of_row(it.w.b, it.row_b, p);
#pragma unroll
      for (int e = 0; e < kBlockN / 2; ++e) {
        const int key = k0 + (e / 4) * 8 + (lane % 4) * 2 + (e % 2);
        if ((e % 4) < 2 ? hidden_key_from(it.row_a, first_a, key, p)
                        : hidden_key_from(it.row_b, first_b, key, p))
          s[e] = -INFINITY;
      }
    }
    // The maxima the exponentials are taken against move only when some row of the warp has
    // grown past its own by more than 2^kMaxGrowthLog2 (FlashAttention-4's lazy rescaling):
    // P then stays below 2^8, and O and the sum, both taken against the same maximum, need no
    // correction (32 or 64 multiplies a thread per tile). Exact either way: out = O / sum, and
    // lse = max scale + ln(sum) for whichever maximum they share.
    constexpr float kMaxGrowthLog2 = 8.0f;
    float mx[2];
    bool grown = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = row_max[r];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
        mx[r] = fmaxf(mx[r], fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      // From -inf (no key seen yet) any key is growth; -inf to -inf (NaN) is none.
      grown = grown || (mx[r] - row_max[r]) * p.scale_log2 > kMaxGrowthLog2;
    }
    rescale = __any_sync(0xffffffffu, grown);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (rescale) {
        // A row that has seen no key yet keeps max -inf; subtracting 0 keeps exp2(-inf) = 0.
        const float new_log2 = mx[r] == -INFINITY ? 0.0f : mx[r] * p.scale_log2;
        correction[r] = exp2_approx(row_max[r] * p.scale_log2 - new_log2);
        row_max[r] = mx[r];
        row_sum[r] *= correction[r];
      }
      const float base_log2 = row_max[r] == -INFINITY ? 0.0f : row_max[r] * p.scale_log2;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = exp2_approx(fmaf(s[4 * j + 2 * r + e], p.scale_log2, -base_log2));
          s[4 * j + 2 * r + e] = pe;
          row_sum[r] += pe;
        }
      }
    }
  };
  // The softmax of an item's first tile, once its S has completed: the rows start afresh (O,
  // zeroed by the caller, needs no correction).
  auto first_softmax = [&](const Item& it) {
    if (it.n_mine() == 1) mbarrier_arrive(q_empty);  // its last S read Q
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
    softmax(it, 0);
  };

  // FlashAttention-3's overlap within a warpgroup: S_{t+1} is issued before O += P_t V_t, and
  // its softmax runs while the tensor cores still work on P_t V_t. P_t (pa, bf16) and O stay
  // untouched until that product has completed; s is free for S_{t+1} once P_t is in pa. The
  // same across items: the next item's S_0 and its softmax overlap this item's last P V, so
  // the consumers (which start an item together) do not leave the tensor cores idle
  // between items.
  // Which kind of product the S of an item's first tile is: a half tile's when that tile is also
  // its last.
  auto first_is_half = [&](const Item& it) { return it.n_mine() == 1 && it.last_tile_half; };
  Item it = next_item();
  if (it.w.n_tiles > 0) {
    take_q();
    auto first_scores = [&](auto half) {
      issue_scores(it, 0, half);
      wgmma_wait<0>();
      scores_landed(half);
    };
    if (first_is_half(it))
      first_scores(HalfTile{});
    else
      first_scores(FullTile{});
    first_softmax(it);
#pragma unroll
    for (int e = 0; e < D / 2; ++e) o[e] = 0.0f;
    accumulators_to_a<kBlockN>(pa, s);
  }
  // The item's first step not yet taken (the epilogue takes the next item's step 0 in its shadow).
  int first_step = 0;
  while (it.w.n_tiles > 0) {
    const int my_tiles = it.n_mine();
    // Every tile but the last: two products in flight (S_{t+1}, issued first, and P_t V_t), then
    // the softmax of the later one (a half tile's S on the last step when the last tile is one),
    // then O's correction and P_{t+1} into pa. The last tile's P V is peeled off rather than
    // guarded by a branch, so that the groups in flight are the same on every path (ptxas
    // otherwise serializes every wgmma, warning C7514). Written as parts, which took the
    // head-dim-128 SASS unchanged; other arrangements of the same code moved its registers enough
    // to serialize its wgmmas (C7511).
    auto finish_step = [&](const Item& item, int t, auto half_next) {
      issue_pv(item, t, FullTile{});
      wgmma_wait<1>();  // S_{t+1} has completed; P_t V_t may still be running
      scores_landed(half_next);
      if (t + 2 == item.n_mine()) mbarrier_arrive(q_empty);  // the last S read Q
      softmax(item, t + 1);
      wgmma_wait<0>();
    };
    auto after_step = [&](const Item& item, int t) {
      pin_registers(o);
      pin_registers(pa);
      mbarrier_arrive(bars.empty((item.first_load + t) % kStages));  // K_t (read by S_t) and V_t
      if (rescale) {
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            o[4 * j + 2 * r] *= correction[r];
            o[4 * j + 2 * r + 1] *= correction[r];
          }
        }
      }
      accumulators_to_a<kBlockN>(pa, s);
    };
    auto step = [&](int t, auto half_next) {
      issue_scores(it, t + 1, half_next);
      finish_step(it, t, half_next);
    };
    for (int t = first_step; t + 1 < my_tiles; ++t) {
      if (t + 2 == my_tiles && it.last_tile_half)
        step(t, HalfTile{});
      else
        step(t, FullTile{});
      after_step(it, t);
    }
    // The last P V, with the next item's first S and softmax in its shadow; each pair of kinds
    // on a path of its own up to the wait for both.
    ++items;
    const float done_max[2] = {row_max[0], row_max[1]}, done_sum[2] = {row_sum[0], row_sum[1]};
    const Item next = next_item();
    // The item's tiles after this consumer's last, which none of its rows sees: handed back once
    // loaded (before the next item's first, which the ring may load into one of their stages).
    if constexpr (kSkipHiddenTiles) {
      for (int t = my_tiles; t < it.w.n_tiles; ++t) {
        const int ring = it.first_load + t;
        mbarrier_wait(bars.full(ring % kStages), (ring / kStages) & 1);
        mbarrier_arrive(bars.empty(ring % kStages));
      }
    }
    // kStagedOutput: out is staged in the item's last K tile, which is free once every consumer's
    // last S of the item has read it: the event q_empty's phase for the item marks. Waited for
    // before this consumer's first arrival for the next item (first_softmax), which could
    // otherwise complete the next phase and hide this one's parity.
    auto last_keys_read = [&] { mbarrier_wait(q_empty, (items & 1) ^ 1); };
    auto last_pv = [&](auto half_last) {
      if (next.w.n_tiles > 0) {
        take_q();
        auto with_next_scores = [&](auto half_first) {
          issue_scores(next, 0, half_first);
          issue_pv(it, my_tiles - 1, half_last);
          wgmma_wait<1>();  // the next S_0 has completed
          if constexpr (kStagedOutput<D>) last_keys_read();
          scores_landed(half_first);
          first_softmax(next);
          wgmma_wait<0>();
        };
        if (first_is_half(next))
          with_next_scores(HalfTile{});
        else
          with_next_scores(FullTile{});
      } else {
        issue_pv(it, my_tiles - 1, half_last);
        wgmma_wait<0>();
        if constexpr (kStagedOutput<D>) last_keys_read();
      }
    };
    if (it.last_tile_half)
      last_pv(HalfTile{});
    else
      last_pv(FullTile{});
    pin_registers(o);
    pin_registers(pa);
    const int last_stage = (it.first_load + my_tiles - 1) % kStages;
    if constexpr (!kStagedOutput<D>) mbarrier_arrive(bars.empty(last_stage));
    // When the next item has a second tile, its S_1 (s is free once P_0 is in pa) is issued
    // before this item's out is written, and runs in the epilogue's shadow: the consumers reach
    // the epilogue together, so the tensor cores would otherwise idle through it. The next item's
    // first step is then finished here. S_1 is issued as a full tile's product even where it is a
    // half tile (the mask hides the second half's keys): a half tile's path here made ptxas
    // serialize the wgmmas.
    if (next.w.n_tiles > 0) accumulators_to_a<kBlockN>(pa, s);  // the next item's P_0
    auto write_out = [&] {
      if constexpr (kStagedOutput<D>) {  // the stage goes back once the stores have read its K tile
        write_output_rows_staged<D, kBlockN>(
            &out_map, k_tile(last_stage), it.w.h, it.w.q0, it.w.b, it.lse_head, consumer, warp,
            lane, done_sum, done_max, p, [&](int j, int r, int e) { return o[4 * j + 2 * r + e]; });
        mbarrier_arrive(bars.empty(last_stage));
      } else {
        write_output_rows_quad<D>(it.out_head, it.lse_head, it.row_a, lane, done_sum, done_max, p,
                                  [&](int j, int r, int e) { return o[4 * j + 2 * r + e]; });
      }
#pragma unroll
      for (int e = 0; e < D / 2; ++e) o[e] = 0.0f;
    };
    first_step = 0;
    if (next.w.n_tiles > 0 && next.n_mine() > 1) {
      issue_scores(next, 1, FullTile{});
      write_out();
      finish_step(next, 0, FullTile{});
      after_step(next, 0);
      first_step = 1;
    } else {
      write_out();
    }
    it = next;
  }
#endif
}

// ---- launcher --------------------------------------------------------------------------------

// A tail block's start (its launch, barriers and first loads, with no item of its own before it
// to overlap) in key tiles, for the simulation that sizes the walk's tail (query_grid). Fitted to
// the forwards timed on an H200 with every tail size from 0 to 6 (doc/benchmarks.md): a tile at
// head dim 128 picks the fastest size at 2k and 4k tokens; half a tile at 64 picks TinyLlama's.
template <int D>
constexpr double kTailBlockStartTiles = D == 128 ? 1.0 : 0.5;

// Stages: as many as the 227 KiB of shared memory per block take with room to spare.
template <int D>
constexpr int kForwardStages = D == 128 ? 3 : 4;

// The forward's grid for shape s: items of forward_block_rows(D) query rows, persistent walkers
// and a tail where the simulation finds one faster (query_grid).
template <int D>
QueryGrid forward_grid(const AttentionShape& s, const Params& p) {
  const int64_t q_blocks = grid_blocks(s.q_len, forward_block_rows(D), "q_len");
  // A (batch, head) pair's share of its kv head's K and V is what its items read from L2.
  const int64_t kv_bytes_per_pair = 2 * s.kv_len * tile_bytes(1, D) / p.group;
  return query_grid(p, s.batch * s.n_heads, q_blocks,
                    key_tiles_by_rank<forward_block_rows(D), kFwdBlockN>, kv_bytes_per_pair,
                    QueryWalk::kPersistentThenTail, kTailBlockStartTiles<D>);
}

template <int D>
void forward_for(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                 const AttentionShape& s, cudaStream_t stream) {
  constexpr int kStages = kForwardStages<D>;
  constexpr int smem = ForwardSmem<D, kStages>::kLaunchBytes;
  static_assert(smem <= 227 * 1024, "forward tiles exceed shared memory");
  const auto kernel = flash_sm90_forward_kernel<D, kStages>;
  allow_shared_memory(kernel, smem);
  const CUtensorMap q_map = tensor_map(q, s.batch, s.q_len, s.n_heads, D, forward_block_rows(D));
  const CUtensorMap k_map = tensor_map(k, s.batch, s.kv_len, s.n_kv_heads, D, kFwdBlockN);
  const CUtensorMap v_map = tensor_map(v, s.batch, s.kv_len, s.n_kv_heads, D, kFwdBlockN);
  // Only the staged epilogue stores out through a map; q's stands in for it otherwise.
  const CUtensorMap out_map =
      kStagedOutput<D> ? tensor_map(out, s.batch, s.q_len, s.n_heads, D, kRowsPerWarp) : q_map;
  const Params p = make_params(s);
  const QueryGrid grid = forward_grid<D>(s, p);
  kernel<<<grid.blocks, forward_threads(D), smem, stream>>>(out, lse, q_map, k_map, v_map, out_map,
                                                            p, grid.order);
  CUDA_CHECK_LAUNCH();
  if (grid.tail_blocks > 0)
    launch_tail(kernel, grid.tail_blocks, forward_threads(D), smem, stream, out, lse, q_map, k_map,
                v_map, out_map, p, grid.tail_order);
}

}  // namespace

void flash_attention_sm90_forward(bf16* out, float* lse, const bf16* q, const bf16* k,
                                  const bf16* v, const AttentionShape& s, cudaStream_t stream) {
  if (s.batch == 0 || s.q_len == 0) return;
  // With no keys every row is out = 0, lse = -inf; TMA cannot describe an empty tensor.
  if (s.kv_len == 0) return flash_attention_forward(out, lse, q, k, v, s, stream);
  if (s.head_dim == 64)
    forward_for<64>(out, lse, q, k, v, s, stream);
  else if (s.head_dim == 128)
    forward_for<128>(out, lse, q, k, v, s, stream);
  else
    fail("cuda flash attention sm90: head_dim ", s.head_dim, " is not supported (64 or 128)");
}

int64_t flash_attention_sm90_forward_tail_blocks(const AttentionShape& s) {
  if (s.batch == 0 || s.q_len == 0 || s.kv_len == 0) return 0;  // no kernel runs
  const Params p = make_params(s);
  if (s.head_dim == 64) return forward_grid<64>(s, p).tail_blocks;
  if (s.head_dim == 128) return forward_grid<128>(s, p).tail_blocks;
  fail("cuda flash attention sm90: head_dim ", s.head_dim, " is not supported (64 or 128)");
}

}  // namespace frugal::cuda
