// The Hopper attention backward's dK/dV pass, with dQ fused in on request (the outline is in
// flash_attention_sm90.cu, the instructions in flash_attention_sm90.cuh).
#include <cstdint>
#include <vector>

#include "kernels/attention_backward_tiles.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_sm90.cuh"

namespace frugal::cuda::sm90 {

namespace {

// ---- backward: dK and dV, and dQ in the same pass ---------------------------------------------

constexpr int kDkdvBlockN = 2 * kRowsPerConsumer;  // keys per block, 64 per consumer
constexpr int kDkdvBlockM = 64;                    // query rows per step
static_assert(kDkdvBlockM == kFlashDqTileRows, "the scratch holds a dQ turn per 64-row tile");
// A consumer's part of a step's dQ (64 rows x 64 columns, fp32) in shared memory, as TMA reads
// it: two boxes of 32 columns (128 bytes a row), each 128-byte swizzled like the bf16 tiles
// (16-byte chunk c of row r at c ^ (r % 8)), which keeps the consumers' float2 stores from piling
// onto the same banks.
constexpr int kDqBoxColumns = 32;
constexpr int kDqBoxBytes = kDkdvBlockM * kSwizzleBytes;
constexpr int kDqPartBytes = 2 * kDqBoxBytes;
// Byte offset of (row, column) in a part: column < 64, an even one starts a float2.
__host__ __device__ constexpr int dq_part_offset(int row, int column) {
  return (column / kDqBoxColumns) * kDqBoxBytes + row * kSwizzleBytes +
         ((((column % kDqBoxColumns) / 4) ^ (row % 8)) * 16) + (column % 4) * 4;
}
// Who multiplies a step's dQ part dS K (64 queries x D, over all 128 keys of the block, so both
// consumers' dS): at head dim 128 each consumer its 64 columns on every step; at 64 the
// consumers take turns by step, each its whole part, which leaves nothing for the writer to sum
// and half the parts to hand over.
template <int D>
__device__ __forceinline__ bool multiplies_dq(int consumer, int step) {
  return D == 128 || step % 2 == consumer;
}
// Named barriers of the fused kernel: dS written (both consumers), and per consumer (id + c)
// its dQ part written (to the writer warp) and free again (to the consumer).
constexpr int kBarrierDsWritten = 1, kBarrierDqPartWritten = 2, kBarrierDqPartFree = 4;
static_assert(kBarrierDqPartFree + 1 < kBarrierGradientsStaged, "named barrier ids overlap");
constexpr int kDqHandOffThreads = kWarpgroupThreads + 32;  // a consumer + the writer warp
// Consumer `consumer`'s barrier kBarrier + consumer between it and the writer warp: kWait waits
// for the other side, otherwise this side arrives and goes on.
template <int kBarrier, bool kWait>
__device__ __forceinline__ void dq_hand_off(int consumer) {
  consumer_barrier<kBarrier, kWait>(consumer, kDqHandOffThreads);
}

// K, V, then kStages (Q, dO) stages, [fused: 2 dS tiles (64 queries x 128 keys, bf16, by step
// parity), 2 dQ parts (one per consumer)], then per stage 64 lse_log2 and 64 Delta values, then
// the barriers (K and V loaded; per stage full and empty).
template <int D, int kStages, bool kFusedDq>
struct DkdvSmem {
  static constexpr int kK = 0;
  static constexpr int kV = kK + tile_bytes(kDkdvBlockN, D);
  static constexpr int kQdo = kV + tile_bytes(kDkdvBlockN, D);
  static constexpr int kTileBytes = tile_bytes(kDkdvBlockM, D);
  static constexpr int kStageBytes = 2 * kTileBytes;  // Q then dO
  static constexpr int kDsTileBytes = tile_bytes(kDkdvBlockM, kDkdvBlockN);
  static constexpr int kDs = kQdo + kStages * kStageBytes;
  static constexpr int kDqParts = kDs + (kFusedDq ? 2 * kDsTileBytes : 0);
  static constexpr int kRowValues = kDqParts + (kFusedDq ? 2 * kDqPartBytes : 0);
  static constexpr int kRowValueBytes = 2 * kDkdvBlockM * 4;  // lse_log2 then Delta
  static constexpr int kBarriers = kRowValues + kStages * kRowValueBytes;
  static constexpr int kBytes = kBarriers + 8 * (1 + 2 * kStages);
  static constexpr int kLaunchBytes = kBytes + kSwizzlePeriodBytes;
};

// kFusedDq: the block also adds its part of dQ = dS K into dq (dq_map, fp32, boxes of 64 rows x
// 32 columns; dq_turns: B x H x query tiles counters, zero at launch) in the fixed order of
// attention_backward_tiles.h; otherwise dq is left to flash_sm90_backward_dq_kernel. dk, dv:
// as put_gradient_pair; written (bf16) ones leave through dk_map and dv_map (boxes of 64 rows).
template <int D, int kStages, bool kFusedDq, class GradT>
__global__ void __launch_bounds__(kThreads, 1) flash_sm90_backward_dkdv_kernel(
    GradT* __restrict__ dk, GradT* __restrict__ dv, const __grid_constant__ CUtensorMap dk_map,
    const __grid_constant__ CUtensorMap dv_map, const __grid_constant__ CUtensorMap dq_map,
    int* dq_turns, const __grid_constant__ CUtensorMap q_map,
    const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
    const __grid_constant__ CUtensorMap dout_map, const float* __restrict__ lse_log2,
    const float* __restrict__ delta, const Params p, const HeadGroupedOrder order) {
#if FRUGAL_SM90_DEVICE_CODE
  using Smem = DkdvSmem<D, kStages, kFusedDq>;
  constexpr int kBlockM = kDkdvBlockM, kBlockN = kDkdvBlockN;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = swizzle_aligned(smem_raw);
  unsigned char* smem = smem_raw + (base - smem_address(smem_raw));
  // Fused: the key blocks of one kv head are neighbours in the grid (x), the last (shortest)
  // first, as they add to dq first; so they run together, and dq's tiles stay in L2 between
  // their adds. A block waits only for blocks of lower index, which CUDA starts first (in
  // practice: not a documented guarantee). Otherwise block x in HeadGroupedOrder over (batch,
  // kv head) pairs, rank = key block from the first (the longest): the blocks of a group of kv
  // heads run together and share their Q and dO tiles in L2.
  int batch_head, n;
  if constexpr (kFusedDq) {
    batch_head = blockIdx.y;
    n = gridDim.x - 1 - blockIdx.x;
  } else {
    order.at(blockIdx.x, batch_head, n);
  }
  const int b = batch_head / p.n_kv_heads, g = batch_head % p.n_kv_heads, j0 = n * kBlockN;
  // With packed documents the tiles end at the last key's document (the same ranges, so the
  // same dQ turn order, in every block).
  const flash_tiles::BackwardTiling tiling{
      p.q_len,
      p.kv_len,
      p.causal_offset,
      p.window,
      kBlockM,
      kBlockN,
      p.key_doc_end != nullptr ? p.key_doc_end + static_cast<int64_t>(b) * p.kv_len : nullptr,
      p.query_position0};
  const flash_tiles::TileRange tiles = flash_tiles::query_tiles_of_key_block(tiling, n);
  const int n_steps = p.group * (tiles.end - tiles.begin);
  const int64_t kv_head = static_cast<int64_t>(b) * p.kv_len * p.kv_stride + g * D;
  if (n_steps == 0) {  // adds nothing
    write_untouched_rows<D, kBlockN>(dk + kv_head, j0, p.kv_len, p.kv_stride, threadIdx.x);
    write_untouched_rows<D, kBlockN>(dv + kv_head, j0, p.kv_len, p.kv_stride, threadIdx.x);
    return;
  }

  const uint32_t sk = base + Smem::kK, sv = base + Smem::kV, kv_full = base + Smem::kBarriers;
  const StageBarriers<kStages> bars{kv_full};
  auto q_tile = [&](int stage) { return base + Smem::kQdo + stage * Smem::kStageBytes; };
  auto dout_tile = [&](int stage) { return q_tile(stage) + Smem::kTileBytes; };
  auto row_lse = [&](int stage) {
    return reinterpret_cast<float*>(smem + Smem::kRowValues + stage * Smem::kRowValueBytes);
  };
  auto row_delta = [&](int stage) { return row_lse(stage) + kBlockM; };
  // Steps walk the query tiles upwards (heads of the group inner), in step with the dQ order.
  auto step_tile = [&](int step) { return tiles.begin + step / p.group; };
  auto step_head = [&](int step) { return g * p.group + step % p.group; };
  // A stage is full when the producer warp's 32 lanes arrive (lane 0 with the bytes).
  bars.init(32);

  if (threadIdx.x < kWarpgroupThreads) {  // producer: its first warp loads, the second adds dQ
    registers_decrease<kProducerRegisters>();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      if (lane == 0) {
        mbarrier_arrive_expect_bytes(kv_full, 2 * tile_bytes(kBlockN, D));
        tma_load_rows<D, kBlockN>(sk, &k_map, kv_full, g, j0, b);
        tma_load_rows<D, kBlockN>(sv, &v_map, kv_full, g, j0, b);
      }
      for (int step = 0; step < n_steps; ++step) {
        const int stage = step % kStages, h = step_head(step), i0 = step_tile(step) * kBlockM;
        mbarrier_wait(bars.empty(stage), ((step / kStages) & 1) ^ 1);
        // Rows past q_len get lse_log2 = +inf and Delta = 0: P = 0, dS = 0, they add nothing.
        const int64_t row_head = (static_cast<int64_t>(b) * p.n_heads + h) * p.q_len;
        for (int r = lane; r < kBlockM; r += 32) {
          const bool valid = i0 + r < p.q_len;
          row_lse(stage)[r] = valid ? lse_log2[row_head + i0 + r] : INFINITY;
          row_delta(stage)[r] = valid ? delta[row_head + i0 + r] : 0.0f;
        }
        if (lane == 0) {
          mbarrier_arrive_expect_bytes(bars.full(stage), Smem::kStageBytes);
          tma_load_rows<D, kBlockM>(q_tile(stage), &q_map, bars.full(stage), h, i0, b);
          tma_load_rows<D, kBlockM>(dout_tile(stage), &dout_map, bars.full(stage), h, i0, b);
        } else {
          mbarrier_arrive(bars.full(stage));
        }
      }
    } else if (kFusedDq && threadIdx.x < 64) {
      // The dQ writer: per step, once the blocks after this one have added theirs to the tile,
      // the step's parts go to dq through the copy engine (TMA fp32 reduce-add of 32-column
      // boxes; rows past q_len are clipped); the tile's turn passes on once those adds have
      // landed. Lane 0 does the copies and the turns.
      const int lane = threadIdx.x - 32;
      const int n_tiles = flash_tiles::query_tiles(tiling);
      auto part = [&](int consumer) { return base + Smem::kDqParts + consumer * kDqPartBytes; };
      auto pass_turn = [&](int* turn) {
        if (lane == 0) {
          fence_proxy_async_global();
          add_release(turn, 1);
        }
      };
      int* landing = nullptr;  // the previous step's tile, passed on once its adds have landed
      // Each part starts free (if its consumer writes it at all: barriers stay balanced).
      for (int c = 0; c < 2; ++c)
        if ((D == 128 ? 0 : c) < n_steps) dq_hand_off<kBarrierDqPartFree, false>(c);
      for (int step = 0; step < n_steps; ++step) {
        const int m = step_tile(step), h = step_head(step);
        int* turn = dq_turns + (static_cast<int64_t>(b) * p.n_heads + h) * n_tiles + m;
        const int my_turn = flash_tiles::last_key_block_of_tile(tiling, m, gridDim.x) - n;
        for (int c = 0; c < 2; ++c)
          if (multiplies_dq<D>(c, step)) dq_hand_off<kBarrierDqPartWritten, true>(c);
        if (lane == 0) {
          while (load_acquire(turn) != my_turn) {
          }
          fence_proxy_async_global();  // the adds of the blocks after this one come first
          const int row0 = m * kBlockM;
          for (int c = 0; c < 2; ++c) {
            if (!multiplies_dq<D>(c, step)) continue;
            const int column0 = D == 128 ? 64 * c : 0;
            for (int box = 0; box < 2; ++box)
              tma_store_tile<BulkStore::kAdd>(&dq_map, part(c) + box * kDqBoxBytes,
                                              column0 + box * kDqBoxColumns, h, row0, b);
          }
          bulk_commit();
          bulk_wait_read<0>();
        }
        __syncwarp();
        // A part is handed back if its consumer writes it again.
        for (int c = 0; c < 2; ++c) {
          const int next = D == 128 ? step + 1 : step + 2;
          if (multiplies_dq<D>(c, step) && next < n_steps)
            dq_hand_off<kBarrierDqPartFree, false>(c);
        }
        if (landing != nullptr) {
          if (lane == 0) bulk_wait<1>();
          pass_turn(landing);
        }
        landing = turn;
      }
      if (lane == 0) bulk_wait<0>();
      pass_turn(landing);
    }
    return;
  }

  // Consumers: warpgroup c owns keys [j0 + 64 c, j0 + 64 c + 64).
  registers_increase<kConsumerRegisters>();
  const int consumer = threadIdx.x / kWarpgroupThreads - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int key_a = j0 + consumer * kRowsPerConsumer + warp * 16 + lane / 4, key_b = key_a + 8;
  // Rows from these on do not see the key (window, document: row_end_of_key); from all_seen_end
  // on, some key of the block is hidden from them (its first key's bound is the lowest).
  const int end_a = row_end_of_key(b, key_a, p), end_b = row_end_of_key(b, key_b, p);
  const int all_seen_end = row_end_of_key(b, j0, p);
  float dk_acc[D / 2], dv_acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk_acc[i] = dv_acc[i] = 0.0f;

  mbarrier_wait(kv_full, 0);
  // At head dim 64 this consumer's rows of K and V, the A operands of S^T and dP^T on every
  // step, stay in registers (32 of them): those products then read only Q and dO from shared
  // memory. At 128 the accumulators take the room.
  constexpr bool kKvInRegisters = D == 64;
  [[maybe_unused]] uint32_t k_frag[D / 16][4], v_frag[D / 16][4];
  if constexpr (kKvInRegisters) {
    load_a_fragments<D, kBlockN>(k_frag, sk, consumer * kRowsPerConsumer, warp, lane);
    load_a_fragments<D, kBlockN>(v_frag, sv, consumer * kRowsPerConsumer, warp, lane);
  }
  // Zero, but not to ptxas: see K and V's use on every step.
  const uint32_t opaque_zero = static_cast<uint32_t>(n_steps) >> 31;
  // S^T = K Q^T and dP^T = V dO^T: 64 keys (rows) x 64 queries per consumer, as two groups so
  // that P^T is computed while the tensor cores still work on dP^T, and dS^T while they work on
  // dV. Without the fused dQ, the next step's S^T is issued right behind this step's dK, so that
  // the wait for its tiles and its start overlap dK (the dK/dV pass 2.5 % faster at 4k and 16k
  // tokens, head dim 128, H200). Every product still completes before the step ends: kept in
  // flight across the loop's back edge, it made ptxas serialize every wgmma (C7514).
  constexpr bool kEarlyScores = !kFusedDq;
  float st[kBlockM / 2], dpt[kBlockM / 2];
  auto issue_scores = [&](int step) {
    const int stage = step % kStages;
    mbarrier_wait(bars.full(stage), (step / kStages) & 1);
    wgmma_fence();
    if constexpr (kKvInRegisters)
      issue_product_rs_k<D, kBlockM>(st, k_frag, q_tile(stage));
    else
      issue_product_ss<D, kBlockN, kBlockM>(st, sk, consumer * kRowsPerConsumer, q_tile(stage));
  };
  if constexpr (kEarlyScores) {
    if (n_steps > 0) issue_scores(0);
  }
  for (int step = 0; step < n_steps; ++step) {
    const int stage = step % kStages, i0 = step_tile(step) * kBlockM;
    if constexpr (!kEarlyScores) issue_scores(step);
    wgmma_fence();
    if constexpr (kKvInRegisters)
      issue_product_rs_k<D, kBlockM>(dpt, v_frag, dout_tile(stage));
    else
      issue_product_ss<D, kBlockN, kBlockM>(dpt, sv, consumer * kRowsPerConsumer, dout_tile(stage));
    wgmma_wait<1>();  // S^T has completed
    pin_registers(st);

    // P^T = exp2(S^T scale log2(e) - lse_log2), 0 where masked; dV += P^T dO.
    // lse_log2 and Delta of accumulator value i's query column 8 (i / 4) + 2 (lane % 4) + i % 2.
    // The separate-dQ kernel reads each pair of columns with one 8-byte load; the fused one reads
    // them one by one: pairs measured 8 % slower there at 16k tokens, head dim 128 (455 against
    // 418 TFLOP/s forward + backward, H200, 2026-12-03; not understood) and 3 % faster at 4k.
    auto row_value = [&](const float* values, int i) {
      if constexpr (kFusedDq) {
        return values[(i / 4) * 8 + (lane % 4) * 2 + (i % 2)];
      } else {
        const float2 pair = reinterpret_cast<const float2*>(values)[4 * (i / 4) + lane % 4];
        return i % 2 == 0 ? pair.x : pair.y;
      }
    };
    const float* lse_t = row_lse(stage);
    const float* delta_t = row_delta(stage);
    // Masks where a key is after a row, or the last row is past the first key's window or
    // document, or past kv_len (K's rows there read as zeros: S = 0, and P must not be
    // exp2(-lse_log2)).
    // A hidden S^T is -inf (lse_log2 is never -inf), so P^T = 0. Masking in its own loop, taken
    // on the few steps that need it: in the exponentials' loop the compiler evaluated the mask
    // on every step, predicated off (6 issue slots per score; ncu, H200, 2026-12-03).
    if (j0 + kBlockN - 1 > i0 + p.causal_offset || j0 + kBlockN > p.kv_len ||
        i0 + kBlockM > all_seen_end) {
#pragma unroll
      for (int i = 0; i < kBlockM / 2; ++i) {
        const int row = i0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
        const int key = (i % 4) < 2 ? key_a : key_b;
        if (row + p.causal_offset < key || key >= p.kv_len || row >= ((i % 4) < 2 ? end_a : end_b))
          st[i] = -INFINITY;
      }
    }
#pragma unroll
    for (int i = 0; i < kBlockM / 2; ++i)
      st[i] = exp2_approx(fmaf(st[i], p.scale_log2, -row_value(lse_t, i)));
    uint32_t pa[kBlockM / 16][4], dsa[kBlockM / 16][4];
    accumulators_to_a<kBlockM>(pa, st);
    wgmma_fence();
    pin_registers(dv_acc);
    pin_registers(pa);
    issue_product_rs<D, kBlockM>(dv_acc, pa, dout_tile(stage));
    wgmma_wait<1>();  // dP^T has completed; dV may still be running
    pin_registers(dpt);

    // dS^T = P^T (dP^T - Delta); dK += dS^T Q (the scale is applied once at the end).
#pragma unroll
    for (int i = 0; i < kBlockM / 2; ++i) {
      dpt[i] = st[i] * (dpt[i] - row_value(delta_t, i));
    }
    accumulators_to_a<kBlockM>(dsa, dpt);
    // By step parity: a tile is written again two steps on, after every consumer that multiplied
    // it has said at the dS barrier of the step between that its product completed.
    const uint32_t sds = base + Smem::kDs + (step % 2) * Smem::kDsTileBytes;
    if constexpr (kFusedDq) {
      // dS (queries x keys) for dQ = dS K: this consumer's dS^T fragments stored transposed
      // into its 64-key column block of the swizzled tile (8 keys = one 16-byte chunk).
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        const int matrix = lane / 8;
        const int query = 16 * kk + 8 * (matrix / 2) + lane % 8;
        const int chunk = 2 * warp + matrix % 2;
        stmatrix_x4_transposed(sds + consumer * column_block_bytes(kBlockM) +
                                   query * kSwizzleBytes + ((chunk ^ (query % 8)) * 16),
                               dsa[kk]);
      }
    }
    // dQ part = dS K, 64 columns of it (D 128: consumer c's columns [64 c, 64 c + 64)) over all
    // 128 keys, by the consumer whose turn it is; the other only says its dS is written. Issued
    // before dK += dS^T Q, so that the part is stored to shared memory while dK runs.
    [[maybe_unused]] float dq_part[32];
    [[maybe_unused]] bool multiplies = false;
    if constexpr (kFusedDq) {
      multiplies = multiplies_dq<D>(consumer, step);
      fence_proxy_async_shared();
      if (multiplies) {
        named_barrier_sync(kBarrierDsWritten, kConsumerThreads);
        const uint32_t k_columns = sk + (D == 128 ? consumer : 0) * column_block_bytes(kBlockN);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk)
          wgmma_ss<64, BMajor::mn>(dq_part, k_major<kBlockM>(sds, 0, kk),
                                   mn_major<kBlockN>(k_columns, kk), kk > 0);
        wgmma_commit();
      } else {
        named_barrier_arrive(kBarrierDsWritten, kConsumerThreads);
      }
    }
    wgmma_fence();
    pin_registers(dk_acc);
    pin_registers(dsa);
    issue_product_rs<D, kBlockM>(dk_acc, dsa, q_tile(stage));
    if constexpr (kKvInRegisters) {
      // An ordinary use of K and V on every step (before the next S^T reads K; dV and dK do not
      // read them). Read only by wgmmas, ptxas (CUDA 13.0) took them for dead after the first
      // step's products and gave their registers to P^T and dS^T (the separate-dQ kernel's SASS;
      // its dK and dV came out wrong).
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) k_frag[kk][e] ^= opaque_zero, v_frag[kk][e] ^= opaque_zero;
    }
    if constexpr (kEarlyScores) {
      if (step + 1 < n_steps) issue_scores(step + 1);
    }
    if constexpr (kFusedDq) wgmma_wait<1>();  // dV and the dQ part have completed, dK may not
    if (kFusedDq && multiplies) {
      pin_registers(dq_part);
      dq_hand_off<kBarrierDqPartFree, true>(consumer);
      unsigned char* part = smem + Smem::kDqParts + consumer * kDqPartBytes;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<float2*>(
              part + dq_part_offset(warp * 16 + lane / 4 + 8 * r, 8 * j + 2 * (lane % 4))) =
              make_float2(p.scale * dq_part[4 * j + 2 * r], p.scale * dq_part[4 * j + 2 * r + 1]);
      fence_proxy_async_shared();
      dq_hand_off<kBarrierDqPartWritten, false>(consumer);
    }
    wgmma_wait<0>();
    pin_registers(dk_acc);
    pin_registers(dv_acc);
    pin_registers(pa);  // the registers of A operands are read until the wgmma completes
    pin_registers(dsa);
    mbarrier_arrive(bars.empty(stage));
  }

  if constexpr (std::is_same_v<GradT, bf16>) {
    // This consumer's rows of K and V were read by its own products only (the fused dQ, which
    // reads all of K, takes fp32 gradients), all completed: its dK and dV take their place.
    static_assert(!kFusedDq, "the fused dQ adds into fp32 gradients only");
    write_gradient_rows<D, kBlockN>(consumer, warp, lane,
                                    GradientRows<D>{&dk_map, sk, p.scale, dk_acc, g, j0, b},
                                    GradientRows<D>{&dv_map, sv, 1.0f, dv_acc, g, j0, b});
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = r == 0 ? key_a : key_b;
      if (key >= p.kv_len) continue;
      const int64_t at = kv_head + key * p.kv_stride + (lane % 4) * 2;
      put_accumulator_row<D>(dk + at, dk_acc, r, p.scale);
      put_accumulator_row<D>(dv + at, dv_acc, r, 1.0f);
    }
  }
#endif
}

// ---- launcher --------------------------------------------------------------------------------

// dq [batch][len][heads][head_dim] (fp32) for the fused dQ's TMA adds: boxes of 64 rows x 32
// columns of one head, 128-byte swizzled (dq_part_offset's layout); rows past len are skipped.
CUtensorMap dq_tensor_map(float* dq, int64_t batch, int64_t len, int64_t heads, int64_t head_dim) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(len), static_cast<cuuint64_t>(batch)};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(heads * head_dim * 4);
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(head_dim * 4), row_bytes,
                                 row_bytes * static_cast<cuuint64_t>(len)};
  const cuuint32_t box[4] = {kDqBoxColumns, 1, kDkdvBlockM, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult status = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, dq, dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    fail("cuda flash attention sm90: cuTensorMapEncodeTiled failed (CUresult ", int(status),
         ") for dq of batch ", batch, " len ", len, " heads ", heads, " head_dim ", head_dim);
  return map;
}

// The steps (query tiles, one per head of the group) of each key block, by HeadGroupedOrder
// rank: rank n is key block n, from the first (the longest under the causal mask). A TilesByRank.
std::vector<int> dkdv_steps_by_rank(const Params& p, int key_blocks) {
  const flash_tiles::BackwardTiling tiling{p.q_len,  p.kv_len,    p.causal_offset,
                                           p.window, kDkdvBlockM, kDkdvBlockN};
  std::vector<int> steps(key_blocks);
  for (int n = 0; n < key_blocks; ++n) {
    const flash_tiles::TileRange tiles = flash_tiles::query_tiles_of_key_block(tiling, n);
    steps[n] = p.group * (tiles.end - tiles.begin);
  }
  return steps;
}

// Stages: as many as the 227 KiB of shared memory per block take with room to spare.
template <int D>
constexpr int kDkdvStages = D == 128 ? 2 : 3;

template <int D, class GradT>
void dkdv_for(float* dq, GradT* dk, GradT* dv, const bf16* dout, const bf16* q, const bf16* k,
              const bf16* v, const float* lse_log2, const float* delta, int* dq_turns,
              const AttentionShape& s, cudaStream_t stream) {
  const Params p = make_params(s);
  const bool fused = dq_turns != nullptr;
  constexpr int kStages = kDkdvStages<D>;
  const CUtensorMap q_map = tensor_map(q, s.batch, s.q_len, s.n_heads, D, kDkdvBlockM);
  const CUtensorMap dout_map = tensor_map(dout, s.batch, s.q_len, s.n_heads, D, kDkdvBlockM);
  const CUtensorMap k_map = tensor_map(k, s.batch, s.kv_len, s.n_kv_heads, D, kDkdvBlockN);
  const CUtensorMap v_map = tensor_map(v, s.batch, s.kv_len, s.n_kv_heads, D, kDkdvBlockN);
  const unsigned key_blocks = grid_blocks(s.kv_len, kDkdvBlockN, "kv_len");
  const auto batch_heads = static_cast<unsigned>(s.batch * s.n_kv_heads);
  if (fused && batch_heads > 65535)
    fail("cuda flash attention sm90: batch x kv heads = ", batch_heads,
         " is more than the grid's 65535");
  if (!fused && int64_t{batch_heads} * key_blocks > INT32_MAX)
    fail("cuda flash attention sm90: ", int64_t{batch_heads} * key_blocks,
         " blocks of keys is too many");
  // Not fused: one block per (128 keys, kv head, batch) in HeadGroupedOrder (rank = key block),
  // a pair's blocks sharing the Q and dO of its group's heads.
  HeadGroupedOrder order{static_cast<int>(batch_heads), static_cast<int>(key_blocks), 1};
  if (!fused) {
    const int64_t q_head_bytes = 2 * s.q_len * tile_bytes(1, D);  // Q and dO of one head
    order.pairs_per_group = pairs_per_group(p, order.pairs, order.items_per_pair,
                                            dkdv_steps_by_rank, q_head_bytes * p.group);
  }
  const dim3 grid = fused ? dim3(key_blocks, batch_heads) : dim3(batch_heads * key_blocks);
  // Maps a launch has no use for (of dq without the fused dQ, of dk and dv when they are
  // added into): a copy of q's stands in.
  const CUtensorMap dq_map = fused ? dq_tensor_map(dq, s.batch, s.q_len, s.n_heads, D) : q_map;
  const CUtensorMap dk_map = written_gradient_map(dk, s.batch, s.kv_len, s.n_kv_heads, D, q_map);
  const CUtensorMap dv_map = written_gradient_map(dv, s.batch, s.kv_len, s.n_kv_heads, D, q_map);
  auto launch = [&](auto kernel, int smem) {
    allow_shared_memory(kernel, smem);
    kernel<<<grid, kThreads, smem, stream>>>(dk, dv, dk_map, dv_map, dq_map, dq_turns, q_map, k_map,
                                             v_map, dout_map, lse_log2, delta, p, order);
    CUDA_CHECK_LAUNCH();
  };
  if constexpr (std::is_same_v<GradT, float>) {
    if (fused) {
      constexpr int smem = DkdvSmem<D, kStages, true>::kLaunchBytes;
      static_assert(smem <= 227 * 1024, "dK/dV/dQ tiles exceed shared memory");
      CUDA_CHECK(
          cudaMemsetAsync(dq_turns, 0, flash_attention_dq_turn_count(s) * sizeof(int), stream));
      launch(flash_sm90_backward_dkdv_kernel<D, kStages, true, GradT>, smem);
      return;
    }
  } else {
    FRUGAL_CHECK(!fused, "cuda flash attention sm90: the fused dQ adds into fp32 gradients only");
  }
  constexpr int smem = DkdvSmem<D, kStages, false>::kLaunchBytes;
  static_assert(smem <= 227 * 1024, "dK/dV tiles exceed shared memory");
  launch(flash_sm90_backward_dkdv_kernel<D, kStages, false, GradT>, smem);
}

}  // namespace

template <class GradT>
void dkdv_pass(float* dq, GradT* dk, GradT* dv, const bf16* dout, const bf16* q, const bf16* k,
               const bf16* v, const float* lse_log2, const float* delta, int* dq_turns,
               const AttentionShape& s, cudaStream_t stream) {
  if (s.head_dim == 64)
    dkdv_for<64>(dq, dk, dv, dout, q, k, v, lse_log2, delta, dq_turns, s, stream);
  else
    dkdv_for<128>(dq, dk, dv, dout, q, k, v, lse_log2, delta, dq_turns, s, stream);
}

template void dkdv_pass(float*, float*, float*, const bf16*, const bf16*, const bf16*, const bf16*,
                        const float*, const float*, int*, const AttentionShape&, cudaStream_t);
template void dkdv_pass(float*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                        const float*, const float*, int*, const AttentionShape&, cudaStream_t);

}  // namespace frugal::cuda::sm90
