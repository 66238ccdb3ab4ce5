// Causal (optionally sliding-window, optionally packed-document) GQA attention on the tensor
// cores, FlashAttention-2 style
// (head dims 64 and 128): a fused forward and a three-kernel deterministic backward, all on
// mma.sync m16n8k16 (bf16 in, fp32 accumulate) with ldmatrix and cp.async: the portable sm_80+
// path (sm_86/89 included).
//
// Fragments: a warp owns 16 rows of every product it computes. m16n8k16 keeps a 16x8 fp32
// accumulator tile as 4 values per lane (rows lane/4 and lane/4 + 8, columns 2 (lane%4) + 0, 1),
// which is also the layout of the A operand of the next product (16 rows x 16 of k), so P and
// dS go from accumulators to operands in registers (rounded to bf16), never through memory.
// Shared-memory tiles hold rows of D bf16 as 16-byte chunks, chunk c of row r stored at
// c ^ (r % 8): the 8 rows one ldmatrix phase reads at one column hit 8 different bank groups.
//
// Forward: one block of 8 warps per (128 query rows, head, batch), launched longest rows
// first. Q fragments stay in registers; K and V tiles of 64 keys are double-buffered through
// cp.async (the next tile loads while this one is used); S = Q K^T, the online softmax in fp32
// (exp2 with the scale folded in), O += P V. Key tiles past the last key the block's last row
// sees, or before the first key its first row sees (sliding window, packed documents: the
// first key of the first row's document), are never loaded; only tiles that cross the diagonal,
// the window's or a document's edge or kv_len are masked. So a window of packed documents of
// length L costs O(L) key tiles per block, not the causal prefix.
//
// Backward, with no float atomics (every gradient element has one writer, summed in a fixed
// order), recomputing P = exp(S - lse) instead of storing it:
//  1. prepare: per row Delta = rowsum(dO * O) and lse * log2(e) (-inf, a row that sees nothing,
//     becomes +inf so that P = 0) into the scratch.
//  2. dK/dV: one block per (128 keys, kv head, batch); each warp owns 16 keys and computes the
//     transposed products S^T = K Q^T and dP^T = V dO^T, so that P^T and dS^T are already A
//     operands for dV += P^T dO and dK += dS^T Q. The block loops over the query tiles of every
//     query head of its group (from the first row that sees its first key to the last row that
//     sees its last key, under a sliding window or the end of its last key's document): the GQA
//     sum happens in registers, K/V are never copied.
//  3. dQ: one block per (query tile, head, batch), like the forward: S, dP, dS again, then
//     dQ += dS K. (Recomputing S and dP costs 2 of the 7 products; the alternative, atomics on
//     dQ from the dK/dV blocks, would make the sum order nondeterministic.)
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_common.cuh"

namespace frugal::cuda {

namespace {

using namespace flash;
using bf16 = __nv_bfloat16;
using ::frugal::cpu::AttentionShape;

// ---- PTX wrappers -----------------------------------------------------------------------------

// 16 bytes global -> shared, bypassing L1; with pred false the destination is zero-filled.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// c += a b for one 16x8 tile, k = 16 (a: 16x16 row-major fragment, b: 16x8 column fragment).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Accumulator tiles n and n + 1 (16 rows x 16 columns) as the A operand of the next product.
__device__ __forceinline__ void accumulators_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                                  const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// ---- shared-memory tiles ---------------------------------------------------------------------

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of D-element rows.
template <int D>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  static_assert(D / 8 >= 8, "the swizzle needs at least 8 chunks per row");
  return static_cast<uint32_t>((row * (D / 8) + (chunk ^ (row & 7))) * 16);
}

// ldmatrix addresses for this lane (lane = 0..31):
//  - a_operand: rows r0..r0+15, columns 16 kk..: the A fragment of a row-major tile.
//  - b_rows:    rows n0..n0+15 as the columns of two 8-wide B fragments (B = tile^T), k = 16 kk..
//               -> registers {0, 1} for rows n0..n0+7, {2, 3} for n0+8..n0+15.
//  - b_trans:   rows k0 = 16 kk.. as k, columns 16 dn.. as two 8-wide B fragments (with .trans)
//               -> registers {0, 1} for columns 16 dn..+7, {2, 3} for +8..+15.
template <int D>
__device__ __forceinline__ uint32_t a_operand(uint32_t tile, int r0, int kk, int lane) {
  return tile + tile_offset<D>(r0 + lane % 16, kk * 2 + lane / 16);
}
template <int D>
__device__ __forceinline__ uint32_t b_rows(uint32_t tile, int n0, int kk, int lane) {
  return tile + tile_offset<D>(n0 + lane % 8 + (lane / 16) * 8, kk * 2 + (lane / 8) % 2);
}
template <int D>
__device__ __forceinline__ uint32_t b_trans(uint32_t tile, int kk, int dn, int lane) {
  return tile + tile_offset<D>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8, dn * 2 + lane / 16);
}

// Starts copying rows [row0, row0 + kRows) of one head (rows `stride` elements apart) into a
// swizzled tile; rows at or past `len` are zero-filled.
// The backward's two products that share one loop: c1 = A1 B1^T and c2 = A2 B2^T for this
// warp's 16 rows of the tiles a1, a2 against the kN rows of the tiles b1, b2 (S and dP, or
// their transposes).
template <int D, int kN>
__device__ __forceinline__ void paired_products(float (&c1)[kN / 8][4], float (&c2)[kN / 8][4],
                                                uint32_t a1, uint32_t a2, uint32_t b1, uint32_t b2,
                                                int warp, int lane) {
#pragma unroll
  for (int n = 0; n < kN / 8; ++n) {
    c1[n][0] = c1[n][1] = c1[n][2] = c1[n][3] = 0.0f;
    c2[n][0] = c2[n][1] = c2[n][2] = c2[n][3] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t x1[4], x2[4];
    ldmatrix_x4(x1, a_operand<D>(a1, warp * 16, kk, lane));
    ldmatrix_x4(x2, a_operand<D>(a2, warp * 16, kk, lane));
#pragma unroll
    for (int nn = 0; nn < kN / 16; ++nn) {
      uint32_t y1[4], y2[4];
      ldmatrix_x4(y1, b_rows<D>(b1, nn * 16, kk, lane));
      mma(c1[2 * nn], x1, y1[0], y1[1]);
      mma(c1[2 * nn + 1], x1, y1[2], y1[3]);
      ldmatrix_x4(y2, b_rows<D>(b2, nn * 16, kk, lane));
      mma(c2[2 * nn], x2, y2[0], y2[1]);
      mma(c2[2 * nn + 1], x2, y2[2], y2[3]);
    }
  }
}

template <int D, int kRows, int kThreads>
__device__ __forceinline__ void load_tile_async(uint32_t tile, const bf16* head, int64_t stride,
                                                int row0, int len) {
  constexpr int kChunks = D / 8;
  static_assert((kRows * kChunks) % kThreads == 0, "tile chunks must split evenly over threads");
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int e = threadIdx.x + it * kThreads;
    const int r = e / kChunks, c = e % kChunks;
    const int row = row0 + r;
    const bool valid = row < len;
    const bf16* src = valid ? head + row * stride + c * 8 : head;
    cp_async_16(tile + tile_offset<D>(r, c), src, valid);
  }
}

// ---- forward ---------------------------------------------------------------------------------

constexpr int kFwdWarps = 8, kFwdThreads = kFwdWarps * 32;
constexpr int kFwdBlockM = 16 * kFwdWarps, kFwdBlockN = 64;

template <int D, int kStages>
constexpr int forward_smem_bytes() {
  return (kFwdBlockM + 2 * kStages * kFwdBlockN) * D * 2;  // Q; K and V, kStages each
}

// kStages K/V tiles in flight: 3 where shared memory allows (loads run two tiles ahead), else 2.
// Head dim 64 fits two blocks per multiprocessor.
template <int D, int kStages>
__global__ void __launch_bounds__(kFwdThreads, D == 64 ? 2 : 1)
    flash_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                         const bf16* __restrict__ q, const bf16* __restrict__ k,
                         const bf16* __restrict__ v, const Params p) {
  constexpr int kBlockM = kFwdBlockM, kBlockN = kFwdBlockN, kTileBytes = kBlockN * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const int b = blockIdx.x / p.n_heads, h = blockIdx.x % p.n_heads, g = h / p.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;  // the longest rows are launched first
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bf16* q_head = q + static_cast<int64_t>(b) * p.q_len * p.q_stride + h * D;
  bf16* out_head = out + static_cast<int64_t>(b) * p.q_len * p.q_stride + h * D;
  const int64_t kv_head = static_cast<int64_t>(b) * p.kv_len * p.kv_stride + g * D;
  float* lse_head = lse + (static_cast<int64_t>(b) * p.n_heads + h) * p.q_len;

  // Keys [kv_begin, kv_end) are seen by some row of the block (the first row sees the earliest
  // keys: window and document starts never decrease): tiles outside are never loaded, so a
  // sliding window of W keys costs O(W) per block, whatever the sequence length, and so do
  // packed documents of W tokens.
  const int last_row = min(q0 + kBlockM, p.q_len) - 1;
  const int kv_end = keys_seen(last_row, p);
  const int kv_begin = first_key_of_row(b, q0, p) / kBlockN * kBlockN;
  const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kBlockN - 1) / kBlockN : 0;
  if (n_tiles == 0) {  // no row of the block sees a key
    write_unseen_rows<D, kBlockM, kFwdThreads>(out_head, lse_head, q0, p, threadIdx.x);
    return;
  }

  const uint32_t sq = smem_address(smem), sk = sq + kBlockM * D * 2, sv = sk + kStages * kTileBytes;
  auto load_kv = [&](int tile) {  // into buffer tile % kStages
    const int buf = tile % kStages;
    load_tile_async<D, kBlockN, kFwdThreads>(sk + buf * kTileBytes, k + kv_head, p.kv_stride,
                                             kv_begin + tile * kBlockN, p.kv_len);
    load_tile_async<D, kBlockN, kFwdThreads>(sv + buf * kTileBytes, v + kv_head, p.kv_stride,
                                             kv_begin + tile * kBlockN, p.kv_len);
  };
  load_tile_async<D, kBlockM, kFwdThreads>(sq, q_head, p.q_stride, q0, p.q_len);
  load_kv(0);
  cp_async_commit();
#pragma unroll
  for (int tile = 1; tile < kStages - 1; ++tile) {
    if (tile < n_tiles) load_kv(tile);
    cp_async_commit();  // one group per tile, empty past the end, so the counts below hold
  }

  const int row_a = q0 + warp * 16 + lane / 4, row_b = row_a + 8;  // this lane's two rows
  const int first_a = first_key_of_row(b, row_a, p), first_b = first_key_of_row(b, row_b, p);
  // Keys [unmasked_begin, unmasked_end) every row of the block sees (and that exist): tiles
  // inside need no mask.
  const int unmasked_end = min(q0 + p.causal_offset + 1, p.kv_len);
  const int unmasked_begin = first_key_of_row(b, last_row, p);
  uint32_t qf[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile t is visible to all; every warp is done with tile t - 1's buffers
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qf[kk], a_operand<D>(sq, warp * 16, kk, lane));
    }
    if (t + kStages - 1 < n_tiles) load_kv(t + kStages - 1);  // into tile t - 1's buffers
    cp_async_commit();
    const int buf = t % kStages;
    const uint32_t kt = sk + buf * kTileBytes, vt = sv + buf * kTileBytes;

    float s[kBlockN / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nn = 0; nn < kBlockN / 16; ++nn) {
        uint32_t bk[4];
        ldmatrix_x4(bk, b_rows<D>(kt, nn * 16, kk, lane));
        mma(s[2 * nn], qf[kk], bk[0], bk[1]);
        mma(s[2 * nn + 1], qf[kk], bk[2], bk[3]);
      }
    }
    const int k0 = kv_begin + t * kBlockN;
    if (k0 + kBlockN > unmasked_end || k0 < unmasked_begin) {
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + n * 8 + (lane % 4) * 2 + (e & 1);
          if (e < 2 ? hidden_key_from(row_a, first_a, key, p)
                    : hidden_key_from(row_b, first_b, key, p))
            s[n][e] = -INFINITY;
        }
      }
    }
    // Online softmax, rows in fp32: a row's 64 scores are spread over the 4 lanes of a quad.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row that has seen no key yet keeps max -inf; subtracting 0 keeps exp2(-inf) = 0.
      const float base = mx == -INFINITY ? 0.0f : mx * p.scale_log2;
      const float correction = exp2_approx(row_max[r] * p.scale_log2 - base);
      row_max[r] = mx;
      row_sum[r] *= correction;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][2 * r] *= correction;
        o[n][2 * r + 1] *= correction;
      }
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = exp2_approx(fmaf(s[n][2 * r + e], p.scale_log2, -base));
          s[n][2 * r + e] = pe;
          row_sum[r] += pe;
        }
      }
    }
    // O += P V, P rounded to bf16 in registers.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pa[4];
      accumulators_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, b_trans<D>(vt, kk, dn, lane));
        mma(o[2 * dn], pa, bv[0], bv[1]);
        mma(o[2 * dn + 1], pa, bv[2], bv[3]);
      }
    }
  }

  write_output_rows<D>(out_head, lse_head, row_a, lane, row_sum, row_max, p,
                       [&](int j, int r, int e) { return o[j][2 * r + e]; });
}

// ---- backward --------------------------------------------------------------------------------

// Per query row: delta = dO . O, lse_log2 = lse * log2(e), with -inf (the row sees no key)
// turned into +inf so that exp2(s - lse_log2) = 0. A block takes kPrepareTokens consecutive
// positions of one sequence with all their heads: rows of dO and O that lie back to back
// ([batch, q_len, heads, D]), D/8 lanes to a row and 16 bytes to a lane, so each warp access
// reads 512 contiguous bytes. The dot products wait in shared memory and go out head by head
// as runs of kPrepareTokens floats of delta and lse_log2 ([batch, head, row]), whole 32-byte
// sectors. (One thread per row read 4 KiB-strided addresses: 43 us a call at the 1.1B model's
// shape on an H200, against 67 MB read.)
constexpr int kPrepareThreads = 256, kPrepareTokens = 8;

template <int D>
__global__ void __launch_bounds__(kPrepareThreads)
    flash_backward_prepare_kernel(float* __restrict__ lse_log2, float* __restrict__ delta,
                                  const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                  const float* __restrict__ lse, int q_len, int n_heads) {
  extern __shared__ float dots[];  // [head][token of the block]
  constexpr int kLanesPerRow = D / 8, kRowsPerWarp = 32 / kLanesPerRow;
  constexpr int kRowsPerPass = kPrepareThreads / kLanesPerRow;
  const int64_t b = blockIdx.y;
  const int i0 = blockIdx.x * kPrepareTokens;
  const int tokens = min(kPrepareTokens, q_len - i0);
  const int rows = tokens * n_heads;
  const bf16* o_rows = out + (b * q_len + i0) * n_heads * D;
  const bf16* d_rows = dout + (b * q_len + i0) * n_heads * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_in_warp = lane / kLanesPerRow, part = lane % kLanesPerRow;
  // The bound is the same for the whole warp, so every lane takes part in the shuffles.
  for (int first = warp * kRowsPerWarp; first < rows; first += kRowsPerPass) {
    const int r = first + row_in_warp;
    float sum = 0.0f;
    if (r < rows) {
      const uint4 o8 = reinterpret_cast<const uint4*>(o_rows + int64_t(r) * D)[part];
      const uint4 d8 = reinterpret_cast<const uint4*>(d_rows + int64_t(r) * D)[part];
      const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&o8);
      const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&d8);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 of = __bfloat1622float2(o2[e]), df = __bfloat1622float2(d2[e]);
        sum += of.x * df.x + of.y * df.y;
      }
    }
#pragma unroll
    for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (r < rows && part == 0) dots[(r % n_heads) * kPrepareTokens + r / n_heads] = sum;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n_heads * kPrepareTokens; e += kPrepareThreads) {
    const int h = e / kPrepareTokens, t = e % kPrepareTokens;
    if (t >= tokens) continue;
    const int64_t at = (b * n_heads + h) * q_len + i0 + t;
    delta[at] = dots[e];
    const float l = lse[at];
    lse_log2[at] = l == -INFINITY ? INFINITY : l * kLog2e;
  }
}

constexpr int kDkdvWarps = 8, kDkdvThreads = kDkdvWarps * 32, kDkdvBlockN = 16 * kDkdvWarps;

template <int D, int kBlockM, int kStages>
constexpr int dkdv_smem_bytes() {
  // K, V; kStages x (Q, dO, lse_log2, delta)
  return 2 * kDkdvBlockN * D * 2 + kStages * (2 * kBlockM * D * 2 + 2 * kBlockM * 4);
}

// kBlockM query rows per step and kStages steps in flight: 64 and 3 with large shared memory,
// 32 and 2 to fit 99 KiB.
template <int D, int kBlockM, int kStages>
__global__ void __launch_bounds__(kDkdvThreads, 1)
    flash_backward_dkdv_kernel(float* __restrict__ dk, float* __restrict__ dv,
                               const bf16* __restrict__ q, const bf16* __restrict__ k,
                               const bf16* __restrict__ v, const bf16* __restrict__ dout,
                               const float* __restrict__ lse_log2, const float* __restrict__ delta,
                               const Params p) {
  constexpr int kBlockN = kDkdvBlockN, kQBytes = kBlockM * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const int b = blockIdx.x / p.n_kv_heads, g = blockIdx.x % p.n_kv_heads;
  const int j0 = blockIdx.y * kBlockN;  // the first key tiles see the most rows: launched first
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Row i sees key j0 iff j0 <= i + offset: earlier rows see none of this tile. With a sliding
  // window, rows from i_end on see none either (the tile's last key is window or more behind),
  // nor with packed documents rows past the last key's document: they are never loaded, so the
  // tile costs O(window) or O(document) rows.
  const int i_start = min(max(j0 - p.causal_offset, 0), p.q_len);
  const int last_key = min(j0 + kBlockN, p.kv_len) - 1;
  const int i_end = row_end_of_key(b, last_key, p);
  const int n_q_tiles = i_end > i_start ? (i_end - i_start + kBlockM - 1) / kBlockM : 0;
  const int n_steps = p.group * n_q_tiles;
  if (n_steps == 0) return;  // adds nothing

  const uint32_t sk = smem_address(smem), sv = sk + kBlockN * D * 2, sq = sv + kBlockN * D * 2,
                 sdo = sq + kStages * kQBytes;
  float* s_lse = reinterpret_cast<float*>(smem + 2 * kBlockN * D * 2 + 2 * kStages * kQBytes);
  float* s_delta = s_lse + kStages * kBlockM;
  const int64_t kv_head = static_cast<int64_t>(b) * p.kv_len * p.kv_stride + g * D;

  auto load_step = [&](int step, int buf) {
    const int h = g * p.group + step / n_q_tiles;
    const int i0 = i_start + (step % n_q_tiles) * kBlockM;
    const int64_t q_head = static_cast<int64_t>(b) * p.q_len * p.q_stride + h * D;
    load_tile_async<D, kBlockM, kDkdvThreads>(sq + buf * kQBytes, q + q_head, p.q_stride, i0,
                                              p.q_len);
    load_tile_async<D, kBlockM, kDkdvThreads>(sdo + buf * kQBytes, dout + q_head, p.q_stride, i0,
                                              p.q_len);
    // Rows past q_len get lse_log2 = delta = 0: with zero Q and dO they add exactly nothing.
    const int64_t row_head = (static_cast<int64_t>(b) * p.n_heads + h) * p.q_len;
    const int r = threadIdx.x % kBlockM;
    const bool valid = i0 + r < p.q_len;
    if (threadIdx.x < kBlockM)
      cp_async_4(smem_address(s_lse + buf * kBlockM + r),
                 lse_log2 + row_head + (valid ? i0 + r : 0), valid);
    else if (threadIdx.x < 2 * kBlockM)
      cp_async_4(smem_address(s_delta + buf * kBlockM + r), delta + row_head + (valid ? i0 + r : 0),
                 valid);
  };
  load_tile_async<D, kBlockN, kDkdvThreads>(sk, k + kv_head, p.kv_stride, j0, p.kv_len);
  load_tile_async<D, kBlockN, kDkdvThreads>(sv, v + kv_head, p.kv_stride, j0, p.kv_len);
  load_step(0, 0);
  cp_async_commit();
#pragma unroll
  for (int step = 1; step < kStages - 1; ++step) {
    if (step < n_steps) load_step(step, step);
    cp_async_commit();
  }

  const int key_a = j0 + warp * 16 + lane / 4, key_b = key_a + 8;  // this lane's two keys
  // Rows from these on do not see the key (window, document); from all_seen_end on, some key of
  // the tile is hidden from them (the first key's bound is the lowest).
  const int end_a = row_end_of_key(b, key_a, p), end_b = row_end_of_key(b, key_b, p);
  const int all_seen_end = row_end_of_key(b, j0, p);
  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    dk_acc[n][0] = dk_acc[n][1] = dk_acc[n][2] = dk_acc[n][3] = 0.0f;
    dv_acc[n][0] = dv_acc[n][1] = dv_acc[n][2] = dv_acc[n][3] = 0.0f;
  }

  for (int step = 0; step < n_steps; ++step) {
    const int buf = step % kStages;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // step's tiles are visible; every warp is done with step - 1's buffers
    if (step + kStages - 1 < n_steps) load_step(step + kStages - 1, (step + kStages - 1) % kStages);
    cp_async_commit();
    const int i0 = i_start + (step % n_q_tiles) * kBlockM;
    const uint32_t qt = sq + buf * kQBytes, dot = sdo + buf * kQBytes;
    const float* lse_t = s_lse + buf * kBlockM;
    const float* delta_t = s_delta + buf * kBlockM;

    // S^T = K Q^T and dP^T = V dO^T: 16 keys (rows) x kBlockM queries per warp.
    float st[kBlockM / 8][4], dpt[kBlockM / 8][4];
    paired_products<D, kBlockM>(st, dpt, sk, sv, qt, dot, warp, lane);
    // P^T = exp2(S^T scale log2(e) - lse_log2) (0 where masked), dS^T = P^T (dP^T - delta).
    // The last row is past the first key's window or document: those mask too.
    // A hidden S^T is -inf, so P^T = 0 (lse_log2 is never -inf); masked in a loop of its own,
    // taken only on the steps that need it (folded into the loop below, the mask cost issue
    // slots on every step). Keys past kv_len are zero rows whose gradients are never stored:
    // causal, window and document tests suffice.
    if (j0 + kBlockN - 1 > i0 + p.causal_offset || i0 + kBlockM > all_seen_end) {
#pragma unroll
      for (int n = 0; n < kBlockM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = i0 + n * 8 + (lane % 4) * 2 + (e & 1);
          const int key = e < 2 ? key_a : key_b;
          if (row + p.causal_offset < key || row >= (e < 2 ? end_a : end_b)) st[n][e] = -INFINITY;
        }
    }
#pragma unroll
    for (int n = 0; n < kBlockM / 8; ++n) {
      const int col = n * 8 + (lane % 4) * 2;
      const float2 l2 = *reinterpret_cast<const float2*>(lse_t + col);
      const float2 dl = *reinterpret_cast<const float2*>(delta_t + col);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float row_lse = (e & 1) ? l2.y : l2.x, row_delta = (e & 1) ? dl.y : dl.x;
        const float pe = exp2_approx(fmaf(st[n][e], p.scale_log2, -row_lse));
        st[n][e] = pe;
        dpt[n][e] = pe * (dpt[n][e] - row_delta);
      }
    }
    // dV += P^T dO, dK += dS^T Q (the scale is applied once at the end).
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t pa[4], dsa[4];
      accumulators_to_a(pa, st[2 * kk], st[2 * kk + 1]);
      accumulators_to_a(dsa, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t bt[4];
        ldmatrix_x4_trans(bt, b_trans<D>(dot, kk, dn, lane));
        mma(dv_acc[2 * dn], pa, bt[0], bt[1]);
        mma(dv_acc[2 * dn + 1], pa, bt[2], bt[3]);
        ldmatrix_x4_trans(bt, b_trans<D>(qt, kk, dn, lane));
        mma(dk_acc[2 * dn], dsa, bt[0], bt[1]);
        mma(dk_acc[2 * dn + 1], dsa, bt[2], bt[3]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = r == 0 ? key_a : key_b;
    if (key >= p.kv_len) continue;
    const int64_t at = kv_head + key * p.kv_stride + (lane % 4) * 2;
    put_gradient_pairs<D / 8>(dk + at, [&](int n) {
      return make_float2(p.scale * dk_acc[n][2 * r], p.scale * dk_acc[n][2 * r + 1]);
    });
    put_gradient_pairs<D / 8>(
        dv + at, [&](int n) { return make_float2(dv_acc[n][2 * r], dv_acc[n][2 * r + 1]); });
  }
}

constexpr int kDqBlockN = 64;

template <int D, int kWarps, int kStages>
constexpr int dq_smem_bytes() {
  return (2 * 16 * kWarps + 2 * kStages * kDqBlockN) * D * 2;  // Q, dO; K and V, kStages each
}

// kWarps x 16 query rows per block and kStages K/V tiles in flight: 8 and 3 with large shared
// memory, 4 and 2 to fit 99 KiB.
template <int D, int kWarps, int kStages>
__global__ void __launch_bounds__(kWarps * 32, 1)
    flash_backward_dq_kernel(float* __restrict__ dq, const bf16* __restrict__ q,
                             const bf16* __restrict__ k, const bf16* __restrict__ v,
                             const bf16* __restrict__ dout, const float* __restrict__ lse_log2,
                             const float* __restrict__ delta, const Params p) {
  constexpr int kThreads = kWarps * 32, kBlockM = 16 * kWarps, kBlockN = kDqBlockN;
  constexpr int kTileBytes = kBlockN * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const int b = blockIdx.x / p.n_heads, h = blockIdx.x % p.n_heads, g = h / p.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_head = static_cast<int64_t>(b) * p.q_len * p.q_stride + h * D;
  const int64_t kv_head = static_cast<int64_t>(b) * p.kv_len * p.kv_stride + g * D;
  const int64_t row_head = (static_cast<int64_t>(b) * p.n_heads + h) * p.q_len;

  // As in the forward: only the key tiles some row of the block sees.
  const int last_row = min(q0 + kBlockM, p.q_len) - 1;
  const int kv_end = keys_seen(last_row, p);
  const int kv_begin = first_key_of_row(b, q0, p) / kBlockN * kBlockN;
  const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kBlockN - 1) / kBlockN : 0;
  if (n_tiles == 0) return;  // adds nothing

  const uint32_t sq = smem_address(smem), sdo = sq + kBlockM * D * 2, sk = sdo + kBlockM * D * 2,
                 sv = sk + kStages * kTileBytes;
  auto load_kv = [&](int tile) {  // into buffer tile % kStages
    const int buf = tile % kStages;
    load_tile_async<D, kBlockN, kThreads>(sk + buf * kTileBytes, k + kv_head, p.kv_stride,
                                          kv_begin + tile * kBlockN, p.kv_len);
    load_tile_async<D, kBlockN, kThreads>(sv + buf * kTileBytes, v + kv_head, p.kv_stride,
                                          kv_begin + tile * kBlockN, p.kv_len);
  };
  load_tile_async<D, kBlockM, kThreads>(sq, q + q_head, p.q_stride, q0, p.q_len);
  load_tile_async<D, kBlockM, kThreads>(sdo, dout + q_head, p.q_stride, q0, p.q_len);
  load_kv(0);
  cp_async_commit();
#pragma unroll
  for (int tile = 1; tile < kStages - 1; ++tile) {
    if (tile < n_tiles) load_kv(tile);
    cp_async_commit();
  }

  const int row_a = q0 + warp * 16 + lane / 4, row_b = row_a + 8;
  const float lse_a = row_a < p.q_len ? lse_log2[row_head + row_a] : INFINITY;
  const float lse_b = row_b < p.q_len ? lse_log2[row_head + row_b] : INFINITY;
  const float delta_a = row_a < p.q_len ? delta[row_head + row_a] : 0.0f;
  const float delta_b = row_b < p.q_len ? delta[row_head + row_b] : 0.0f;
  const int first_a = first_key_of_row(b, row_a, p), first_b = first_key_of_row(b, row_b, p);
  const int unmasked_end = min(q0 + p.causal_offset + 1, p.kv_len);
  const int unmasked_begin = first_key_of_row(b, last_row, p);
  float dq_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq_acc[n][0] = dq_acc[n][1] = dq_acc[n][2] = dq_acc[n][3] = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (t + kStages - 1 < n_tiles) load_kv(t + kStages - 1);
    cp_async_commit();
    const int buf = t % kStages;
    const uint32_t kt = sk + buf * kTileBytes, vt = sv + buf * kTileBytes;

    float s[kBlockN / 8][4], dp[kBlockN / 8][4];
    paired_products<D, kBlockN>(s, dp, sq, sdo, kt, vt, warp, lane);
    const int k0 = kv_begin + t * kBlockN;
    // Hidden scores are -inf, so P = 0; masked in a loop of its own, as in the dK/dV kernel.
    if (k0 + kBlockN > unmasked_end || k0 < unmasked_begin) {
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + n * 8 + (lane % 4) * 2 + (e & 1);
          if (e < 2 ? hidden_key_from(row_a, first_a, key, p)
                    : hidden_key_from(row_b, first_b, key, p))
            s[n][e] = -INFINITY;
        }
    }
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp2_approx(fmaf(s[n][e], p.scale_log2, -(e < 2 ? lse_a : lse_b)));
        dp[n][e] = pe * (dp[n][e] - (e < 2 ? delta_a : delta_b));
      }
    }
    // dQ += dS K.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t dsa[4];
      accumulators_to_a(dsa, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t bk[4];
        ldmatrix_x4_trans(bk, b_trans<D>(kt, kk, dn, lane));
        mma(dq_acc[2 * dn], dsa, bk[0], bk[1]);
        mma(dq_acc[2 * dn + 1], dsa, bk[2], bk[3]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row_a : row_b;
    if (row >= p.q_len) continue;
    put_gradient_pairs<D / 8>(dq + q_head + row * p.q_stride + (lane % 4) * 2, [&](int n) {
      return make_float2(p.scale * dq_acc[n][2 * r], p.scale * dq_acc[n][2 * r + 1]);
    });
  }
}

// ---- launchers -------------------------------------------------------------------------------

// sm_80 and sm_90 (163 and 227 KiB per block) take the large tiles; sm_86/89/120 (99 KiB) not.
bool large_smem_device() {
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return optin >= std::max({forward_smem_bytes<128, 3>(), dkdv_smem_bytes<128, 64, 3>(),
                            dq_smem_bytes<128, 8, 3>()});
}

template <int D, int kStages>
void forward_launch(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                    const AttentionShape& s, cudaStream_t stream) {
  const Params p = make_params(s);
  constexpr int smem = forward_smem_bytes<D, kStages>();
  allow_shared_memory(flash_forward_kernel<D, kStages>, smem);
  const dim3 grid(static_cast<unsigned>(s.batch * s.n_heads),
                  grid_blocks(s.q_len, kFwdBlockM, "q_len"));
  flash_forward_kernel<D, kStages><<<grid, kFwdThreads, smem, stream>>>(out, lse, q, k, v, p);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void forward_for(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                 const AttentionShape& s, cudaStream_t stream) {
  if (large_smem_device())
    forward_launch<D, 3>(out, lse, q, k, v, s, stream);
  else
    forward_launch<D, 2>(out, lse, q, k, v, s, stream);
}

template <int D, int kDkdvBlockM, int kDqWarps, int kStages>
void backward_kernels(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q,
                      const bf16* k, const bf16* v, const float* lse_log2, const float* delta,
                      const AttentionShape& s, const Params& p, cudaStream_t stream) {
  constexpr int dkdv_smem = dkdv_smem_bytes<D, kDkdvBlockM, kStages>();
  allow_shared_memory(flash_backward_dkdv_kernel<D, kDkdvBlockM, kStages>, dkdv_smem);
  const dim3 dkdv_grid(static_cast<unsigned>(s.batch * s.n_kv_heads),
                       grid_blocks(s.kv_len, kDkdvBlockN, "kv_len"));
  flash_backward_dkdv_kernel<D, kDkdvBlockM, kStages>
      <<<dkdv_grid, kDkdvThreads, dkdv_smem, stream>>>(dk, dv, q, k, v, dout, lse_log2, delta, p);
  CUDA_CHECK_LAUNCH();

  constexpr int dq_smem = dq_smem_bytes<D, kDqWarps, kStages>();
  allow_shared_memory(flash_backward_dq_kernel<D, kDqWarps, kStages>, dq_smem);
  const dim3 dq_grid(static_cast<unsigned>(s.batch * s.n_heads),
                     grid_blocks(s.q_len, 16 * kDqWarps, "q_len"));
  flash_backward_dq_kernel<D, kDqWarps, kStages>
      <<<dq_grid, kDqWarps * 32, dq_smem, stream>>>(dq, q, k, v, dout, lse_log2, delta, p);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void backward_for(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q, const bf16* k,
                  const bf16* v, const bf16* out, const float* lse, const AttentionShape& s,
                  float* scratch, cudaStream_t stream, FlashBackwardTiles tiles) {
  const Params p = make_params(s);
  const int64_t rows = s.batch * s.q_len * s.n_heads;
  float* lse_log2 = scratch;
  float* delta = scratch + rows;
  flash_attention_backward_prepare(scratch, dout, out, lse, s, stream);
  if (tiles == FlashBackwardTiles::kAuto)
    tiles = large_smem_device() ? FlashBackwardTiles::kLargeSmem : FlashBackwardTiles::kSmallSmem;
  if (tiles == FlashBackwardTiles::kLargeSmem)
    backward_kernels<D, 64, 8, 3>(dq, dk, dv, dout, q, k, v, lse_log2, delta, s, p, stream);
  else
    backward_kernels<D, 32, 4, 2>(dq, dk, dv, dout, q, k, v, lse_log2, delta, s, p, stream);
}

}  // namespace

bool flash_attention_supports(const AttentionShape& s,
                              std::initializer_list<const void*> bf16_tensors,
                              std::initializer_list<const void*> fp32_tensors) {
  if (s.head_dim != 64 && s.head_dim != 128) return false;
  for (const void* p : bf16_tensors)
    if (!aligned(p, 16)) return false;
  for (const void* p : fp32_tensors)
    if (!aligned(p, 8)) return false;
  return true;
}

void flash_attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             const AttentionShape& s, cudaStream_t stream) {
  if (s.batch == 0 || s.q_len == 0) return;
  if (s.head_dim == 64)
    forward_for<64>(out, lse, q, k, v, s, stream);
  else if (s.head_dim == 128)
    forward_for<128>(out, lse, q, k, v, s, stream);
  else
    fail("cuda flash attention: head_dim ", s.head_dim, " is not supported (64 or 128)");
}

int64_t flash_attention_backward_scratch_floats(const AttentionShape& s) {
  return 2 * s.batch * s.n_heads * s.q_len + flash_attention_dq_turn_count(s);
}

void flash_attention_backward_prepare(float* scratch, const bf16* dout, const bf16* out,
                                      const float* lse, const AttentionShape& s,
                                      cudaStream_t stream) {
  const int64_t rows = s.batch * s.q_len * s.n_heads;
  if (rows == 0) return;
  const int q_len = static_cast<int>(s.q_len), n_heads = static_cast<int>(s.n_heads);
  const dim3 grid(static_cast<unsigned>((s.q_len + kPrepareTokens - 1) / kPrepareTokens),
                  static_cast<unsigned>(s.batch));
  FRUGAL_CHECK(grid.y <= 65535, "cuda flash attention: batch ", s.batch, " is too large");
  const size_t smem = sizeof(float) * static_cast<size_t>(n_heads) * kPrepareTokens;
  FRUGAL_CHECK(smem <= 48 * 1024, "cuda flash attention: ", n_heads, " heads are too many");
  if (s.head_dim == 64)
    flash_backward_prepare_kernel<64><<<grid, kPrepareThreads, smem, stream>>>(
        scratch, scratch + rows, dout, out, lse, q_len, n_heads);
  else if (s.head_dim == 128)
    flash_backward_prepare_kernel<128><<<grid, kPrepareThreads, smem, stream>>>(
        scratch, scratch + rows, dout, out, lse, q_len, n_heads);
  else
    fail("cuda flash attention: head_dim ", s.head_dim, " is not supported (64 or 128)");
  CUDA_CHECK_LAUNCH();
}

void flash_attention_backward(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q,
                              const bf16* k, const bf16* v, const bf16* out, const float* lse,
                              const AttentionShape& s, float* scratch, cudaStream_t stream,
                              FlashBackwardTiles tiles) {
  if (s.batch == 0 || s.q_len == 0 || s.kv_len == 0) return;
  if (scratch == nullptr)
    fail("cuda flash attention: the backward needs ", flash_attention_backward_scratch_floats(s),
         " floats of scratch, got none");
  if (s.head_dim == 64)
    backward_for<64>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream, tiles);
  else if (s.head_dim == 128)
    backward_for<128>(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream, tiles);
  else
    fail("cuda flash attention: head_dim ", s.head_dim, " is not supported (64 or 128)");
}

}  // namespace frugal::cuda
