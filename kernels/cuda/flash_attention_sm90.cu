// Causal (optionally sliding-window, optionally packed-document) GQA attention on Hopper
// (sm_90a), FlashAttention-3 style, head dims 64 and 128: the same contract and results as
// flash_attention.cu, on wgmma and the TMA copy engine. Under a sliding window or with packed
// documents, key tiles (forward, dQ) and query tiles (dK/dV) wholly outside them are never
// loaded, as in flash_attention.cu: O(S * window) or O(S * document) work. (The schedules below
// are sized for the causal costs: the documents live on the device.)
//
// The files: this one holds the outline of both (below), the backward's launcher and the work
// order's launch shape; flash_attention_sm90_forward.cu the forward; flash_attention_sm90_dkdv.cu
// and flash_attention_sm90_dq.cu the backward's passes; flash_attention_sm90.cuh the block
// shape, tile layout and instructions they all use.
//
// Forward: work items of (query rows, head, batch), 64 rows per consumer warpgroup: two
// consumers (128 rows) at head dim 128, three (192 rows) at 64, as FlashAttention-3 has them;
// longest rows first within groups of heads whose K and V tiles stay in L2 together
// (kernels/head_grouped_order.h; the backward's passes order their blocks the same way);
// persistent (one block per SM walking the items) up to 32 items a sequence (4k tokens at head
// dim 128, 6k at 64), a block per item beyond; where the walk's rounds would end unevenly, each
// sequence's shortest items go to a second grid, a block per item, that starts on the SMs the
// walkers leave (programmatic dependent launch: query_grid, launch_tail). Each consumer holds
// O (64 rows x D, fp32) in registers; per key tile of 128: S = Q K^T (wgmma, Q from shared
// memory), mask (only tiles crossing the diagonal or kv_len), online softmax in fp32 (exp2, scale
// folded in), O += P V with P in registers as bf16. S of the next tile is issued before P V of
// this one, so the softmax of one tile overlaps the tensor cores' P V of the one before
// (FlashAttention-3's intra-warpgroup pipelining), and likewise the next item's first S and softmax
// overlap this item's last P V, and the next item's second S runs through this item's epilogue
// (at head dim 128 out leaves through shared memory and the copy engine, a warp's rows at a time,
// with no barrier between the consumers); the producer
// prefetches the next item's Q into L2; the consumers interleave too. On the diagonal, consumer
// 0 at head dim 128 multiplies only the first half of its last tile, and at 64 a consumer leaves
// out the last tiles none of its rows sees.
//
// Backward, deterministic (the same bits run to run: no float atomics in an unordered sum),
// recomputing P = exp2(S scale log2(e) - lse_log2):
//  1. prepare (flash_attention_backward_prepare): lse_log2 and Delta = rowsum(dO O).
//  2. dK/dV: one block per (128 keys, kv head, batch); each consumer owns 64 keys and
//     computes S^T = K Q^T and dP^T = V dO^T (at head dim 64 with its K and V rows held in
//     registers), so P^T and dS^T are register A operands of dV += P^T dO and dK += dS^T Q. The
//     block walks the 64-row query tiles its keys are seen by, upwards, every head of its group
//     inner (GQA sums in registers), each tile's S^T issued right behind the tile before's dK
//     (without the fused dQ). The producer warp also stages each tile's lse_log2 and Delta in
//     shared memory.
//  3. dQ, either in the same pass (Sm90DqSum::kFused; FlashAttention-3's design, made
//     deterministic): the consumers store dS transposed in shared memory (stmatrix), compute
//     the block's part of dQ = dS K (wgmma, both operands in shared memory; at head dim 128 each
//     consumer 64 columns, at 64 the consumers by turns) and hand it to the producer's second
//     warp, which adds it into dq with the copy engine's fp32 reduce-add
//     (cp.reduce.async.bulk.tensor). The key blocks that add to one query tile take turns, the
//     last block first (attention_backward_tiles.h; a per-tile counter in the scratch,
//     acquire/release), so every dq element is summed in a fixed order. 5 products per pair
//     of tiles. Or (kSeparateKernel) a second kernel over work items of (128 query rows, head,
//     batch) walked like the forward's (persistent at head dim 64, the next item's Q and dO
//     prefetched into L2) holds its rows of Q and dO in registers as the A operands, recomputes
//     S and dP per key tile (128 keys at head dim 64, 64 at 128) and sums dQ += dS K in
//     registers. 7 products. The default fuses where that measured faster (the launcher).
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_sm90.cuh"
#include "kernels/cuda/flash_attention_sm90.h"

namespace frugal::cuda {

using namespace sm90;

namespace sm90 {

namespace {

// What `choose` gives for `key`, worked out once per process: the choices below simulate the work
// order (up to a millisecond), a launch looks them up in well under a microsecond.
template <class Key, class Choose>
int remembered(const Key& key, Choose choose) {
  static std::mutex mutex;
  static std::map<Key, int> chosen;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = chosen.find(key);
  if (found != chosen.end()) return found->second;
  return chosen.emplace(key, choose()).first->second;
}

// choose_tail_ranks for this device, remembered per launch shape as pairs_per_group is.
int tail_ranks(const Params& p, int pairs, int items_per_pair, TilesByRank tiles_by_rank,
               int walk_group, int sms, double block_start_tiles) {
  using Key = std::tuple<TilesByRank, int, int, int, int, double, int, int, int, int, int>;
  const Key key{tiles_by_rank, pairs,    items_per_pair,  walk_group, sms,    block_start_tiles,
                p.q_len,       p.kv_len, p.causal_offset, p.window,   p.group};
  return remembered(key, [&] {
    return work_order::choose_tail_ranks(pairs, tiles_by_rank(p, items_per_pair), walk_group, sms,
                                         block_start_tiles);
  });
}

}  // namespace

QueryGrid query_grid(const Params& p, int64_t pairs, int64_t items_per_pair,
                     TilesByRank tiles_by_rank, int64_t shared_bytes_per_pair, QueryWalk walk,
                     double tail_block_start_tiles) {
  constexpr int64_t kPersistentQueryBlocks = 32;
  const int64_t items = pairs * items_per_pair;
  if (items > INT32_MAX / 2)  // the kernels' item indices stay ints
    fail("cuda flash attention sm90: ", items, " blocks of query rows is too many");
  int group = pairs_per_group(p, static_cast<int>(pairs), static_cast<int>(items_per_pair),
                              tiles_by_rank, shared_bytes_per_pair);
  if (walk == QueryWalk::kBlockPerItem || items_per_pair > kPersistentQueryBlocks)
    return {static_cast<unsigned>(items),
            HeadGroupedOrder{static_cast<int>(pairs), static_cast<int>(items_per_pair), group}};
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // The fixed walk takes the heads one at a time (a round then spans a few heads) unless all
  // pairs stay together (their tiles fit in L2): the group sizes chosen for the hand-out of a
  // grid gave the SMs uneven loads under the fixed walk in a simulation (up to 1.4x the ideal
  // end), one head at a time as even as all pairs together (within 3 %).
  if (group != pairs) group = 1;
  const int tail = walk == QueryWalk::kPersistentThenTail
                       ? tail_ranks(p, static_cast<int>(pairs), static_cast<int>(items_per_pair),
                                    tiles_by_rank, group, sms, tail_block_start_tiles)
                       : 0;
  const int64_t walked = items_per_pair - tail;
  QueryGrid grid{static_cast<unsigned>(std::min<int64_t>(sms, pairs * walked)),
                 HeadGroupedOrder{static_cast<int>(pairs), static_cast<int>(walked), group, tail}};
  if (tail > 0) {
    grid.tail_blocks = static_cast<unsigned>(pairs * tail);
    grid.tail_order = HeadGroupedOrder{static_cast<int>(pairs), tail, static_cast<int>(pairs)};
  }
  return grid;
}

int pairs_per_group(const Params& p, int pairs, int items_per_pair, TilesByRank tiles_by_rank,
                    int64_t shared_bytes_per_pair) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  // The shape as far as the tiles and the choice depend on it (tiles_by_rank names the kernel
  // and its block sizes).
  using Key = std::tuple<int, TilesByRank, int, int, int64_t, int, int, int, int, int>;
  const Key key{device,  tiles_by_rank, pairs,           items_per_pair, shared_bytes_per_pair,
                p.q_len, p.kv_len,      p.causal_offset, p.window,       p.group};
  return remembered(key, [&] {
    int sms = 0, l2_bytes = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
    return work_order::choose_pairs_per_group(pairs, tiles_by_rank(p, items_per_pair),
                                              shared_bytes_per_pair, sms, l2_bytes);
  });
}

}  // namespace sm90

bool flash_attention_sm90_supports(const AttentionShape& s,
                                   std::initializer_list<const void*> bf16_tensors,
                                   std::initializer_list<const void*> fp32_tensors) {
#if defined(FRUGAL_HAVE_SM90A_KERNELS)
  // The FlashAttention-2 kernels' conditions (head dim 64 or 128, alignment), and row indices
  // that fit the kernels' int and TMA's int32 coordinates.
  if (!flash_attention_supports(s, bf16_tensors, fp32_tensors)) return false;
  if (s.q_len > INT32_MAX / 2 || s.kv_len > INT32_MAX / 2) return false;
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;  // sm_90a code runs on exactly this
#else
  (void)s;
  (void)bf16_tensors;
  (void)fp32_tensors;
  return false;  // built without an sm_90 target
#endif
}

namespace {

// Both gradient kinds: the preparation, the dK/dV pass, and dQ fused into it or after it.
template <class GradT>
void backward(GradT* dq, GradT* dk, GradT* dv, const bf16* dout, const bf16* q, const bf16* k,
              const bf16* v, const bf16* out, const float* lse, const AttentionShape& s,
              float* scratch, cudaStream_t stream, Sm90DqSum dq_sum) {
  constexpr bool kAccumulated = std::is_same_v<GradT, float>;
  // The copy engine's adds into dq need 16-byte aligned rows (q_stride is a multiple of 64).
  const bool dq_aligned = flash::aligned(dq, 16);
  if (dq_sum == Sm90DqSum::kFused && !(kAccumulated && dq_aligned))
    fail("cuda flash attention sm90: the fused dQ needs fp32 gradients with dq 16-byte aligned");
  // Written gradients leave through the copy engine, which needs 16-byte aligned rows.
  if (!kAccumulated && !(dq_aligned && flash::aligned(dk, 16) && flash::aligned(dv, 16)))
    fail("cuda flash attention sm90: bf16 gradients dq, dk and dv must be 16-byte aligned");
  if (s.batch == 0) return;
  if (s.q_len == 0 || s.kv_len == 0) {  // no queries or no keys: zero gradients, nothing to add
    if constexpr (!kAccumulated) {
      const size_t q_bytes = sizeof(GradT) * s.batch * s.q_len * s.n_heads * s.head_dim;
      const size_t kv_bytes = sizeof(GradT) * s.batch * s.kv_len * s.n_kv_heads * s.head_dim;
      if (q_bytes > 0) CUDA_CHECK(cudaMemsetAsync(dq, 0, q_bytes, stream));
      if (kv_bytes > 0) CUDA_CHECK(cudaMemsetAsync(dk, 0, kv_bytes, stream));
      if (kv_bytes > 0) CUDA_CHECK(cudaMemsetAsync(dv, 0, kv_bytes, stream));
    }
    return;
  }
  if (scratch == nullptr)
    fail("cuda flash attention sm90: the backward needs ",
         flash_attention_backward_scratch_floats(s), " floats of scratch, got none");
  if (s.head_dim != 64 && s.head_dim != 128)
    fail("cuda flash attention sm90: head_dim ", s.head_dim, " is not supported (64 or 128)");
  flash_attention_backward_prepare(scratch, dout, out, lse, s, stream);
  const int64_t rows = s.batch * s.n_heads * s.q_len;
  const float* lse_log2 = scratch;
  const float* delta = scratch + rows;
  // kAuto (fp32 gradients: a ring's blocks; whole attentions write bf16, attention.h) fuses
  // where that measured faster on an H200 (doc/benchmarks.md): head_dim 128 without GQA,
  // 1.14-1.17x the second kernel's forward + backward. With GQA, or at head_dim 64, fusing
  // measured 0.56-0.96x (at head dim 64 still about 0.7x once the consumers took turns at dS K).
  // Written bf16 gradients take the second kernel.
  const bool fuse =
      dq_sum == Sm90DqSum::kFused || (kAccumulated && dq_sum == Sm90DqSum::kAuto && dq_aligned &&
                                      s.head_dim == 128 && s.n_heads == s.n_kv_heads);
  int* dq_turns = fuse ? reinterpret_cast<int*>(scratch + 2 * rows) : nullptr;
  if constexpr (kAccumulated)
    sm90::dkdv_pass(dq, dk, dv, dout, q, k, v, lse_log2, delta, dq_turns, s, stream);
  else
    sm90::dkdv_pass(static_cast<float*>(nullptr), dk, dv, dout, q, k, v, lse_log2, delta, nullptr,
                    s, stream);
  if (dq_turns == nullptr) sm90::dq_pass(dq, dout, q, k, v, lse_log2, delta, s, stream);
}

}  // namespace

void flash_attention_sm90_backward(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q,
                                   const bf16* k, const bf16* v, const bf16* out, const float* lse,
                                   const AttentionShape& s, float* scratch, cudaStream_t stream,
                                   Sm90DqSum dq_sum) {
  backward(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream, dq_sum);
}

void flash_attention_sm90_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                                   const bf16* k, const bf16* v, const bf16* out, const float* lse,
                                   const AttentionShape& s, float* scratch, cudaStream_t stream,
                                   Sm90DqSum dq_sum) {
  backward(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream, dq_sum);
}

}  // namespace frugal::cuda
