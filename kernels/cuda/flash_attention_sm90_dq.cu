// The Hopper attention backward's separate dQ pass (the outline is in flash_attention_sm90.cu,
// the instructions in flash_attention_sm90.cuh).
#include <cstdint>

#include "kernels/cuda/flash_attention_sm90.cuh"

namespace frugal::cuda::sm90 {

namespace {

// ---- backward: dQ ----------------------------------------------------------------------------

constexpr int kDqBlockM = 2 * kRowsPerConsumer;
// Keys per tile: 128 at head dim 64, where S and dP are then m64n128 products (wider wgmmas
// read less shared memory per FLOP) and the registers allow it; 64 at head dim 128, whose dQ
// accumulator takes the room.
template <int D>
constexpr int kDqBlockN = D == 64 ? 128 : 64;

// Whether the dQ pass walks several items per block (query_grid): at head dim 64 that took the
// TinyLlama shape's pass from 225 to 205 us (H200); at 128 the walk's state cost ptxas the
// registers (spills in the tile loop) and measured 0-6 % slower, so there a block takes one item.
template <int D>
constexpr bool kDqPersistent = D == 64;

// Q, dO, the written dQ's staging tile, then kStages (K, V) stages of kDqBlockN keys, then the
// barriers (Q and dO loaded; per stage full and empty; Q and dO free again).
template <int D, int kStages>
struct DqSmem {
  static constexpr int kQ = 0;
  static constexpr int kDout = kQ + tile_bytes(kDqBlockM, D);
  static constexpr int kStaging = kDout + tile_bytes(kDqBlockM, D);
  static constexpr int kKv = kStaging + tile_bytes(kDqBlockM, D);
  static constexpr int kTileBytes = tile_bytes(kDqBlockN<D>, D);
  static constexpr int kStageBytes = 2 * kTileBytes;  // K then V
  static constexpr int kBarriers = kKv + kStages * kStageBytes;
  static constexpr int kRowsEmpty = kBarriers + 8 * (1 + 2 * kStages);
  static constexpr int kBytes = kRowsEmpty + 8;
  static constexpr int kLaunchBytes = kBytes + kSwizzlePeriodBytes;
};

// dq: added into (fp32) or written (bf16, through dq_map: boxes of 64 rows). Work items of (128
// query rows, head, batch) walked as the forward walks them (query_grid; kDqPersistent): each
// consumer takes its rows of Q and dO into registers and hands their tiles back at once, so the
// next item's Q and dO load while this one's key tiles are multiplied, and its epilogue overlaps
// the next item's first loads.
template <int D, int kStages, class GradT>
__global__ void __launch_bounds__(kThreads, 1) flash_sm90_backward_dq_kernel(
    GradT* __restrict__ dq, const __grid_constant__ CUtensorMap dq_map,
    const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
    const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap dout_map,
    const float* __restrict__ lse_log2, const float* __restrict__ delta, const Params p,
    const HeadGroupedOrder order) {
#if FRUGAL_SM90_DEVICE_CODE
  using Smem = DqSmem<D, kStages>;
  constexpr int kBlockM = kDqBlockM, kBlockN = kDqBlockN<D>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = swizzle_aligned(smem_raw);
  const int n_work = order.pairs * order.items_per_pair;
  auto work_at = [&](int i) { return query_item<kBlockM, kBlockN>(order, p, i); };

  const uint32_t sq = base + Smem::kQ, sdo = base + Smem::kDout, staging = base + Smem::kStaging;
  const uint32_t rows_full = base + Smem::kBarriers, rows_empty = base + Smem::kRowsEmpty;
  const StageBarriers<kStages> bars{rows_full};
  auto k_tile = [&](int stage) { return base + Smem::kKv + stage * Smem::kStageBytes; };
  auto v_tile = [&](int stage) { return k_tile(stage) + Smem::kTileBytes; };
  if (threadIdx.x == 0) mbarrier_init(rows_empty, kConsumerThreads);  // bars.init fences, syncs
  bars.init(1);

  // Producer and consumers walk the same items; K/V tiles go round the stages across items
  // (`loaded` counts them).
  if (threadIdx.x < kWarpgroupThreads) {  // producer
    registers_decrease<kProducerRegisters>();
    if (threadIdx.x == 0) {
      int loaded = 0, items = 0;
      for (int round = 0, i; (i = item_of_round(round)) < n_work; ++round) {
        const QueryItem w = work_at(i);
        if (w.n_tiles == 0) continue;
        mbarrier_wait(rows_empty, (items & 1) ^ 1);
        mbarrier_arrive_expect_bytes(rows_full, 2 * tile_bytes(kBlockM, D));
        tma_load_rows<D, kBlockM>(sq, &q_map, rows_full, w.h, w.q0, w.b);
        tma_load_rows<D, kBlockM>(sdo, &dout_map, rows_full, w.h, w.q0, w.b);
        if (const int after = item_of_round(round + 1); after < n_work) {
          const QueryItem w_after = work_at(after);
          tma_prefetch_rows<D, kBlockM>(&q_map, w_after.h, w_after.q0, w_after.b);
          tma_prefetch_rows<D, kBlockM>(&dout_map, w_after.h, w_after.q0, w_after.b);
        }
        load_kv_tiles<D, kBlockN>(bars, k_tile, v_tile, Smem::kStageBytes, &k_map, &v_map,
                                  w.h / p.group, w.b, w.kv_begin, w.n_tiles, loaded);
        loaded += w.n_tiles;
        ++items;
      }
    }
    return;
  }

  registers_increase<kConsumerRegisters>();
  const int consumer = threadIdx.x / kWarpgroupThreads - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  auto q_head_of = [&](const QueryItem& w) {
    return static_cast<int64_t>(w.b) * p.q_len * p.q_stride + w.h * D;
  };
  // The walk's next item with keys (n_tiles == 0 once the walk is done). Items whose rows see no
  // key add nothing: written gradients get zeros on the way.
  int round = 0, loaded = 0, items = 0;
  auto next_item = [&]() {
    QueryItem w;
    w.n_tiles = 0;
    for (int i; (i = item_of_round(round)) < n_work;) {
      ++round;
      w = work_at(i);
      if (w.n_tiles > 0) break;
      write_untouched_rows<D, kBlockM, GradT, kConsumerThreads>(
          dq + q_head_of(w), w.q0, p.q_len, p.q_stride, threadIdx.x - kWarpgroupThreads);
    }
    return w;
  };

  for (QueryItem w = next_item(); w.n_tiles > 0; w = next_item()) {
    const int first_load = loaded;
    loaded += w.n_tiles;
    const int row_a = w.q0 + consumer * kRowsPerConsumer + warp * 16 + lane / 4, row_b = row_a + 8;
    const int64_t row_head = (static_cast<int64_t>(w.b) * p.n_heads + w.h) * p.q_len;
    // Rows past q_len: lse_log2 = +inf, Delta = 0, so P = dS = 0 (and they are not stored).
    const float lse_a = row_a < p.q_len ? lse_log2[row_head + row_a] : INFINITY;
    const float lse_b = row_b < p.q_len ? lse_log2[row_head + row_b] : INFINITY;
    const float delta_a = row_a < p.q_len ? delta[row_head + row_a] : 0.0f;
    const float delta_b = row_b < p.q_len ? delta[row_head + row_b] : 0.0f;
    const int first_a = first_key_of_row(w.b, row_a, p), first_b = first_key_of_row(w.b, row_b, p);
    const int unmasked_end = min(w.q0 + p.causal_offset + 1, p.kv_len);
    const int unmasked_begin = first_key_of_row(w.b, w.last_row, p);
    float dq_acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dq_acc[i] = 0.0f;

    mbarrier_wait(rows_full, items & 1);
    // This consumer's rows of Q and dO, the A operands of S and dP on every key tile, stay in
    // registers: those products then read only K and V from shared memory. Their tiles go back
    // to the producer for the next item.
    uint32_t q_frag[D / 16][4], dout_frag[D / 16][4];
    load_a_fragments<D, kBlockM>(q_frag, sq, consumer * kRowsPerConsumer, warp, lane);
    load_a_fragments<D, kBlockM>(dout_frag, sdo, consumer * kRowsPerConsumer, warp, lane);
    mbarrier_arrive(rows_empty);
    ++items;
    for (int t = 0; t < w.n_tiles; ++t) {
      const int stage = (first_load + t) % kStages;
      mbarrier_wait(bars.full(stage), ((first_load + t) / kStages) & 1);

      // S = Q K^T and dP = dO V^T: 64 rows x kBlockN keys per consumer, as two groups so that P
      // is computed while the tensor cores still work on dP.
      float s[kBlockN / 2], dp[kBlockN / 2];
      wgmma_fence();
      issue_product_rs_k<D, kBlockN>(s, q_frag, k_tile(stage));
      issue_product_rs_k<D, kBlockN>(dp, dout_frag, v_tile(stage));
      wgmma_wait<1>();  // S has completed
      pin_registers(s);

      const int k0 = w.kv_begin + t * kBlockN;
      // Hidden scores are -inf, so P = 0 (lse_log2 is never -inf); masked in a loop of its own,
      // as the dK/dV pass does, taken only on the tiles that need it.
      if (k0 + kBlockN > unmasked_end || k0 < unmasked_begin) {
#pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i) {
          const int key = k0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
          if ((i % 4) < 2 ? hidden_key_from(row_a, first_a, key, p)
                          : hidden_key_from(row_b, first_b, key, p))
            s[i] = -INFINITY;
        }
      }
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i)
        s[i] = exp2_approx(fmaf(s[i], p.scale_log2, -((i % 4) < 2 ? lse_a : lse_b)));
      wgmma_wait<0>();  // dP has completed
      pin_registers(dp);
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i)
        dp[i] = s[i] * (dp[i] - ((i % 4) < 2 ? delta_a : delta_b));

      // dQ += dS K.
      uint32_t dsa[kBlockN / 16][4];
      accumulators_to_a<kBlockN>(dsa, dp);
      wgmma_fence();
      pin_registers(dq_acc);
      pin_registers(dsa);
      issue_product_rs<D, kBlockN>(dq_acc, dsa, k_tile(stage));
      wgmma_wait<0>();
      pin_registers(dq_acc);
      pin_registers(dsa);  // the registers of A operands are read until the wgmma completes
      mbarrier_arrive(bars.empty(stage));
    }

    if constexpr (std::is_same_v<GradT, bf16>) {
      // Staged in a tile of its own (Q's may hold the next item's rows by now), once this
      // consumer's stores of the item before have read it (its first thread waited for them).
      consumer_barrier<kBarrierGradientsStaged, true>(consumer, kWarpgroupThreads);
      write_gradient_rows<D, kBlockM>(
          consumer, warp, lane, GradientRows<D>{&dq_map, staging, p.scale, dq_acc, w.h, w.q0, w.b});
    } else {
      const int64_t q_head = q_head_of(w);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = r == 0 ? row_a : row_b;
        if (row >= p.q_len) continue;
        put_accumulator_row<D>(dq + q_head + row * p.q_stride + (lane % 4) * 2, dq_acc, r, p.scale);
      }
    }
    if constexpr (!kDqPersistent<D>) break;  // a block per item: no state kept for a next one
  }
#endif
}

// ---- launcher --------------------------------------------------------------------------------

// Stages: as many as the 227 KiB of shared memory per block take with room to spare.
constexpr int kDqStages = 3;

template <int D, class GradT>
void dq_for(GradT* dq, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
            const float* lse_log2, const float* delta, const AttentionShape& s,
            cudaStream_t stream) {
  const Params p = make_params(s);
  constexpr int smem = DqSmem<D, kDqStages>::kLaunchBytes;
  static_assert(smem <= 227 * 1024, "dQ tiles exceed shared memory");
  const auto kernel = flash_sm90_backward_dq_kernel<D, kDqStages, GradT>;
  allow_shared_memory(kernel, smem);
  const CUtensorMap q_map = tensor_map(q, s.batch, s.q_len, s.n_heads, D, kDqBlockM);
  const CUtensorMap dout_map = tensor_map(dout, s.batch, s.q_len, s.n_heads, D, kDqBlockM);
  const CUtensorMap k_map = tensor_map(k, s.batch, s.kv_len, s.n_kv_heads, D, kDqBlockN<D>);
  const CUtensorMap v_map = tensor_map(v, s.batch, s.kv_len, s.n_kv_heads, D, kDqBlockN<D>);
  // Work items of (128 query rows, head, batch) in HeadGroupedOrder, walked as the forward walks
  // its (query_grid): the items of a group of heads run together and share its K and V tiles in
  // L2 (a pair's share of its kv head's K and V).
  const int64_t q_blocks = grid_blocks(s.q_len, kDqBlockM, "q_len");
  const int64_t kv_bytes_per_pair = 2 * s.kv_len * tile_bytes(1, D) / p.group;
  const QueryGrid grid = query_grid(
      p, s.batch * s.n_heads, q_blocks, key_tiles_by_rank<kDqBlockM, kDqBlockN<D>>,
      kv_bytes_per_pair, kDqPersistent<D> ? QueryWalk::kPersistent : QueryWalk::kBlockPerItem);
  const CUtensorMap dq_map = written_gradient_map(dq, s.batch, s.q_len, s.n_heads, D, q_map);
  kernel<<<grid.blocks, kThreads, smem, stream>>>(dq, dq_map, q_map, k_map, v_map, dout_map,
                                                  lse_log2, delta, p, grid.order);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <class GradT>
void dq_pass(GradT* dq, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
             const float* lse_log2, const float* delta, const AttentionShape& s,
             cudaStream_t stream) {
  if (s.head_dim == 64)
    dq_for<64>(dq, dout, q, k, v, lse_log2, delta, s, stream);
  else
    dq_for<128>(dq, dout, q, k, v, lse_log2, delta, s, stream);
}

template void dq_pass(float*, const bf16*, const bf16*, const bf16*, const bf16*, const float*,
                      const float*, const AttentionShape&, cudaStream_t);
template void dq_pass(bf16*, const bf16*, const bf16*, const bf16*, const bf16*, const float*,
                      const float*, const AttentionShape&, cudaStream_t);

}  // namespace frugal::cuda::sm90
