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

// Q, dO, then kStages (K, V) stages of kDqBlockN keys, then the barriers (Q and dO loaded; per
// stage full and empty).
template <int D, int kStages>
struct DqSmem {
  static constexpr int kQ = 0;
  static constexpr int kDout = kQ + tile_bytes(kDqBlockM, D);
  static constexpr int kKv = kDout + tile_bytes(kDqBlockM, D);
  static constexpr int kTileBytes = tile_bytes(kDqBlockN<D>, D);
  static constexpr int kStageBytes = 2 * kTileBytes;  // K then V
  static constexpr int kBarriers = kKv + kStages * kStageBytes;
  static constexpr int kBytes = kBarriers + 8 * (1 + 2 * kStages);
  static constexpr int kLaunchBytes = kBytes + kSwizzlePeriodBytes;
};

// dq: added into (fp32) or written (bf16, through dq_map: boxes of 64 rows).
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
  // Block i: rank 0 of a (batch, head) is its last query block, the longest.
  int bh, rank;
  order.at(blockIdx.x, bh, rank);
  const int b = bh / p.n_heads, h = bh % p.n_heads, g = h / p.group;
  const int q0 = (order.items_per_pair - 1 - rank) * kBlockM;
  const int last_row = min(q0 + kBlockM, p.q_len) - 1;
  const int kv_end = keys_seen(last_row, p);
  const int kv_begin = first_key_seen(q0, p) / kBlockN * kBlockN;
  const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kBlockN - 1) / kBlockN : 0;
  const int64_t q_head = static_cast<int64_t>(b) * p.q_len * p.q_stride + h * D;
  if (n_tiles == 0) {  // adds nothing
    write_untouched_rows<D, kBlockM>(dq + q_head, q0, p.q_len, p.q_stride, threadIdx.x);
    return;
  }

  const uint32_t sq = base + Smem::kQ, sdo = base + Smem::kDout, qdo_full = base + Smem::kBarriers;
  const StageBarriers<kStages> bars{qdo_full};
  auto k_tile = [&](int stage) { return base + Smem::kKv + stage * Smem::kStageBytes; };
  auto v_tile = [&](int stage) { return k_tile(stage) + Smem::kTileBytes; };
  bars.init(1);

  if (threadIdx.x < kWarpgroupThreads) {  // producer
    registers_decrease<kProducerRegisters>();
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_bytes(qdo_full, 2 * tile_bytes(kBlockM, D));
      tma_load_rows<D, kBlockM>(sq, &q_map, qdo_full, h, q0, b);
      tma_load_rows<D, kBlockM>(sdo, &dout_map, qdo_full, h, q0, b);
      load_kv_tiles<D, kBlockN>(bars, k_tile, v_tile, Smem::kStageBytes, &k_map, &v_map, g, b,
                                kv_begin, n_tiles, /*loaded=*/0);
    }
    return;
  }

  registers_increase<kConsumerRegisters>();
  const int consumer = threadIdx.x / kWarpgroupThreads - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int row_a = q0 + consumer * kRowsPerConsumer + warp * 16 + lane / 4, row_b = row_a + 8;
  const int64_t row_head = (static_cast<int64_t>(b) * p.n_heads + h) * p.q_len;
  // Rows past q_len: lse_log2 = +inf, Delta = 0, so P = dS = 0 (and they are not stored).
  const float lse_a = row_a < p.q_len ? lse_log2[row_head + row_a] : INFINITY;
  const float lse_b = row_b < p.q_len ? lse_log2[row_head + row_b] : INFINITY;
  const float delta_a = row_a < p.q_len ? delta[row_head + row_a] : 0.0f;
  const float delta_b = row_b < p.q_len ? delta[row_head + row_b] : 0.0f;
  const int unmasked_end = min(q0 + p.causal_offset + 1, p.kv_len);
  const int unmasked_begin = first_key_seen(last_row, p);
  float dq_acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq_acc[i] = 0.0f;

  mbarrier_wait(qdo_full, 0);
  // This consumer's rows of Q and dO, the A operands of S and dP on every key tile, stay in
  // registers: those products then read only K and V from shared memory.
  uint32_t q_frag[D / 16][4], dout_frag[D / 16][4];
  load_a_fragments<D, kBlockM>(q_frag, sq, consumer * kRowsPerConsumer, warp, lane);
  load_a_fragments<D, kBlockM>(dout_frag, sdo, consumer * kRowsPerConsumer, warp, lane);
  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t % kStages;
    mbarrier_wait(bars.full(stage), (t / kStages) & 1);

    // S = Q K^T and dP = dO V^T: 64 rows x kBlockN keys per consumer, as two groups so that P is
    // computed while the tensor cores still work on dP.
    float s[kBlockN / 2], dp[kBlockN / 2];
    wgmma_fence();
    issue_product_rs_k<D, kBlockN>(s, q_frag, k_tile(stage));
    issue_product_rs_k<D, kBlockN>(dp, dout_frag, v_tile(stage));
    wgmma_wait<1>();  // S has completed
    pin_registers(s);

    const int k0 = kv_begin + t * kBlockN;
    // Hidden scores are -inf, so P = 0 (lse_log2 is never -inf); masked in a loop of its own,
    // as the dK/dV pass does, taken only on the tiles that need it.
    if (k0 + kBlockN > unmasked_end || k0 < unmasked_begin) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        const int key = k0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
        if (hidden_key((i % 4) < 2 ? row_a : row_b, key, p)) s[i] = -INFINITY;
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
    // Q's tile has been in registers since the start: this consumer's dQ takes its rows.
    write_gradient_rows<D, kBlockM>(consumer, warp, lane,
                                    GradientRows<D>{&dq_map, sq, p.scale, dq_acc, h, q0, b});
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = r == 0 ? row_a : row_b;
      if (row >= p.q_len) continue;
      put_gradient_pairs<D / 8>(dq + q_head + row * p.q_stride + (lane % 4) * 2, [&](int j) {
        return make_float2(p.scale * dq_acc[4 * j + 2 * r], p.scale * dq_acc[4 * j + 2 * r + 1]);
      });
    }
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
  // One block per (128 query rows, head, batch), in HeadGroupedOrder: the blocks of a group of
  // heads run together and share its K and V tiles in L2.
  const int64_t pairs = s.batch * s.n_heads, q_blocks = grid_blocks(s.q_len, kDqBlockM, "q_len");
  if (pairs * q_blocks > INT32_MAX)
    fail("cuda flash attention sm90: ", pairs * q_blocks, " blocks of query rows is too many");
  // A (batch, head) pair's share of its kv head's K and V, which its items read from L2.
  const int64_t kv_bytes_per_pair = 2 * s.kv_len * tile_bytes(1, D) / p.group;
  const HeadGroupedOrder order{
      static_cast<int>(pairs), static_cast<int>(q_blocks),
      pairs_per_group(p, static_cast<int>(pairs), static_cast<int>(q_blocks),
                      key_tiles_by_rank<kDqBlockM, kDqBlockN<D>>, kv_bytes_per_pair)};
  const CUtensorMap dq_map = written_gradient_map(dq, s.batch, s.q_len, s.n_heads, D, q_map);
  kernel<<<static_cast<unsigned>(pairs * q_blocks), kThreads, smem, stream>>>(
      dq, dq_map, q_map, k_map, v_map, dout_map, lse_log2, delta, p, order);
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
