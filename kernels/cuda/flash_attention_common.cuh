// What the tensor-core attention kernels share, whatever instructions they multiply with
// (mma.sync in flash_attention.cu, wgmma in flash_attention_sm90.cu): the per-launch
// parameters and the causal (sliding-window, packed-document) mask they encode, a few PTX
// wrappers, the empty-block epilogue and the host-side launch helpers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/cuda_check.h"

namespace frugal::cuda::flash {

inline constexpr float kLog2e = 1.4426950408889634f;

struct Params {
  int q_len, kv_len, n_heads, n_kv_heads, group;
  int causal_offset;  // clamped to [-q_len - 1, kv_len]: the same mask, and it fits an int
  int window;         // sliding window, 0: none; rewritten with the clamp so the mask stays
  float scale, scale_log2;
  int64_t q_stride, kv_stride;  // elements between consecutive rows of one head
  // Packed documents (cpu::DocumentMask, device arrays [batch, q_len] and [batch, kv_len]; null:
  // none). Their positions are of the whole sequence: query row i is at query_position0 + i, key
  // row j at key_position0 + j (query_position0 takes the caller's causal_offset, not the clamped
  // one above, which only has to give the same causal mask).
  const int32_t* query_doc_start;
  const int32_t* key_doc_end;
  int64_t key_position0, query_position0;
};

inline Params make_params(const ::frugal::cpu::AttentionShape& s) {
  Params p{};
  p.q_len = static_cast<int>(s.q_len);
  p.kv_len = static_cast<int>(s.kv_len);
  p.n_heads = static_cast<int>(s.n_heads);
  p.n_kv_heads = static_cast<int>(s.n_kv_heads);
  p.group = p.n_heads / p.n_kv_heads;
  // Row i sees key j iff 0 <= i + offset - j (< window when there is one). An offset past
  // kv_len shows every key to every row as far as causality goes; only the window's lower
  // bound j > i + offset - window moves, so the clamp moves the window with it.
  int64_t offset = s.causal_offset, window = s.window > 0 ? s.window : 0;
  if (offset > s.kv_len) {
    if (window > 0) window -= offset - s.kv_len;
    offset = s.kv_len;
    if (s.window > 0 && window <= 0) offset = -s.q_len - 1;  // every key behind every window
  }
  if (offset <= -s.q_len - 1) offset = -s.q_len - 1, window = 0;  // no row sees a key
  if (window > s.q_len + s.kv_len) window = 0;  // wider than any distance: hides nothing
  p.causal_offset = static_cast<int>(offset);
  p.window = static_cast<int>(window);
  p.scale = s.scale;
  p.scale_log2 = s.scale * kLog2e;
  p.q_stride = s.n_heads * s.head_dim;
  p.kv_stride = s.n_kv_heads * s.head_dim;
  p.query_doc_start = s.documents.query_doc_start;
  p.key_doc_end = s.documents.active() ? s.documents.key_doc_end : nullptr;
  p.key_position0 = s.documents.key_position0;
  p.query_position0 = s.documents.key_position0 + s.causal_offset;
  return p;
}

// Keys that query row `row` sees: j <= row + offset, clipped to [0, kv_len].
__host__ __device__ __forceinline__ int keys_seen(int row, const Params& p) {
  return min(max(row + p.causal_offset + 1, 0), p.kv_len);
}

// The first key query row `row` sees: with a sliding window j > row + offset - window (as
// transformers' sliding_window_overlay: kv_idx > q_idx - window), clipped to [0, kv_len];
// 0 without one.
__host__ __device__ __forceinline__ int first_key_seen(int row, const Params& p) {
  return p.window > 0 ? min(max(row + p.causal_offset - p.window + 1, 0), p.kv_len) : 0;
}

// x clipped to [0, hi].
__device__ __forceinline__ int clip_to(int64_t x, int hi) {
  return x < 0 ? 0 : (x > hi ? hi : static_cast<int>(x));
}

// The first key row `row` of sequence b sees: first_key_seen and, with packed documents, the first
// of its document (rows at or past q_len: first_key_seen). Non-decreasing in row, like both.
__device__ __forceinline__ int first_key_of_row(int b, int row, const Params& p) {
  int first = first_key_seen(row, p);
  if (p.query_doc_start != nullptr && row < p.q_len) {
    const int64_t doc =
        p.query_doc_start[static_cast<int64_t>(b) * p.q_len + row] - p.key_position0;
    first = max(first, clip_to(doc, p.kv_len));
  }
  return first;
}

// One past the last query row that sees key `key` of sequence b as far as the window and (packed
// documents) the key's document go, clipped to [0, q_len] (keys at or past kv_len: the window's
// bound). Non-decreasing in key. The causal bound is the other side: rows before key - offset.
__device__ __forceinline__ int row_end_of_key(int b, int key, const Params& p) {
  int end = p.window > 0 ? min(max(key - p.causal_offset + p.window, 0), p.q_len) : p.q_len;
  if (p.key_doc_end != nullptr && key < p.kv_len) {
    const int64_t doc = p.key_doc_end[static_cast<int64_t>(b) * p.kv_len + key] - p.query_position0;
    end = min(end, clip_to(doc, p.q_len));
  }
  return end;
}

// Whether key `key` is hidden from row `row` whose first seen key is `first` (first_key_of_row):
// before it (window, document), after the row (causal) or past the keys.
__device__ __forceinline__ bool hidden_key_from(int row, int first, int key, const Params& p) {
  return key < first || key > row + p.causal_offset || key >= p.kv_len;
}

// Whether the mask hides every key of [key0, key_end) from every row of [row0, row_end): each
// row's keys seen lie within those of row0's first and the last row's last. Rows at or past q_len
// are padding and count as hidden. (The forward asks it of a tile's second half: a half tile.)
// Causal and window only: with packed documents more may be hidden, which the elementwise mask
// then hides (a false "not hidden" costs work, never a wrong result).
__device__ __forceinline__ bool tile_hidden(int row0, int row_end, int key0, int key_end,
                                            const Params& p) {
  if (row0 >= p.q_len) return true;
  return key0 >= keys_seen(min(row_end, p.q_len) - 1, p) || key_end <= first_key_seen(row0, p);
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 2^x; exactly 0 for -inf.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two adjacent gradient values at `at` (an even element): added into fp32 (GradT float: the
// gradients accumulate, a ring's blocks into the same buffers), or written as bf16 (the call
// makes them whole, so nothing was there to add to).
template <class GradT>
__device__ __forceinline__ void put_gradient_pair(GradT* at, float x, float y) {
  if constexpr (std::is_same_v<GradT, float>) {
    float2* pair = reinterpret_cast<float2*>(at);
    float2 sum = *pair;
    sum.x += x;
    sum.y += y;
    *pair = sum;
  } else {
    static_assert(std::is_same_v<GradT, __nv_bfloat16>);
    *reinterpret_cast<__nv_bfloat162*>(at) = __floats2bfloat162_rn(x, y);
  }
}

// A thread's kPairs gradient pairs of one row, pair j at first + 8 j being pair(j) (a float2),
// each put as put_gradient_pair does; in fp32 every old value is loaded before the first sum
// is stored. Pair by pair, each load waited for memory (a store before it might alias it): at
// head dim 128 the dK/dV epilogue waited 64 times, a fifth of the whole kernel's warp time
// (ncu's stall samples, H200, 2026-12-03).
template <int kPairs, class GradT, class PairFn>
__device__ __forceinline__ void put_gradient_pairs(GradT* first, PairFn pair) {
  if constexpr (std::is_same_v<GradT, float>) {
    float2 old[kPairs];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) old[j] = *reinterpret_cast<const float2*>(first + 8 * j);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const float2 add = pair(j);
      *reinterpret_cast<float2*>(first + 8 * j) = make_float2(old[j].x + add.x, old[j].y + add.y);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const float2 value = pair(j);
      put_gradient_pair(first + 8 * j, value.x, value.y);
    }
  }
}

// A row's sum completed across the quad of lanes that share lane / 4 (each holds some of its
// columns, in the mma.sync and wgmma accumulator layouts alike).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// A row's lse = max * scale + log(sum) from its completed sum and kept maximum; -inf for a row
// that saw no key (sum 0).
__device__ __forceinline__ float lse_of_row(float sum, float row_max, const Params& p) {
  return sum > 0.0f ? row_max * p.scale + logf(sum) : -INFINITY;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A forward block of kBlockM query rows of which none sees a key (all masked): out = 0 and
// lse = -inf for its rows, written by kThreads threads (this one is number `thread`).
template <int D, int kBlockM, int kThreads>
__device__ __forceinline__ void write_unseen_rows(__nv_bfloat16* out_head, float* lse_head, int q0,
                                                  const Params& p, int thread) {
  for (int e = thread; e < kBlockM * D / 8; e += kThreads) {
    const int r = e / (D / 8), c = e % (D / 8);
    if (q0 + r < p.q_len)
      *reinterpret_cast<uint4*>(out_head + (q0 + r) * p.q_stride + c * 8) = make_uint4(0, 0, 0, 0);
  }
  for (int r = thread; r < kBlockM; r += kThreads)
    if (q0 + r < p.q_len) lse_head[q0 + r] = -INFINITY;
}

// The forward's epilogue for one lane's two rows (row_a and row_a + 8; their values spread over
// the quad of lanes that share lane / 4): each row's sum completed across the quad, out = O / sum
// in bf16 and lse = max * scale + log(sum), or 0 and -inf for a row that saw no key.
// o_at(j, r, e): the accumulator of row r's column 8 j + 2 (lane % 4) + e (the mma.sync and
// wgmma layouts store it differently).

// In 4-byte stores, as the FA2 kernels write it (the Hopper forward at head dim 128 stages out for
// the copy engine instead: write_output_rows_staged; there write_output_rows_quad's shuffles had
// made ptxas serialize the wgmmas).
template <int D, class OAt>
__device__ __forceinline__ void write_output_rows(__nv_bfloat16* out_head, float* lse_head,
                                                  int row_a, int lane, const float (&row_sum)[2],
                                                  const float (&row_max)[2], const Params& p,
                                                  OAt o_at) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const int row = row_a + 8 * r;
    if (row >= p.q_len) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<__nv_bfloat162*>(out_head + row * p.q_stride + j * 8 + (lane % 4) * 2) =
          __floats2bfloat162_rn(o_at(j, r, 0) * inv, o_at(j, r, 1) * inv);
    if (lane % 4 == 0) lse_head[row] = lse_of_row(sum, row_max[r], p);
  }
}

// In 16-byte stores after a 4 x 4 transpose of bf16 pairs across the quad (1-1.3 % faster Hopper
// forwards at head dim 64, H200). Both rows are packed and moved before either is stored: with
// the forward's next S in flight over its epilogue, that order measured the fastest of three.
template <int D, class OAt>
__device__ __forceinline__ void write_output_rows_quad(__nv_bfloat16* out_head, float* lse_head,
                                                       int row_a, int lane,
                                                       const float (&row_sum)[2],
                                                       const float (&row_max)[2], const Params& p,
                                                       OAt o_at) {
  // Row r's columns 8 (4 g + lane % 4) .. + 7 end in pairs[r][4 g .. 4 g + 3], bf16 pairs.
  uint32_t pairs[2][D / 8];
  float lse[2];
  const int q = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    lse[r] = lse_of_row(sum, row_max[r], p);
#pragma unroll
    for (int g = 0; g < D / 32; ++g) {
      // Lane q starts with 2 of every 8 columns of groups 4 g .. 4 g + 3; two rounds of shuffles
      // give it all 8 of group 4 g + q. Every lane takes part, also those of a row past q_len
      // (the quad shares its row, so no lane diverges).
      uint32_t* v = pairs[r] + 4 * g;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const __nv_bfloat162 pair =
            __floats2bfloat162_rn(o_at(4 * g + k, r, 0) * inv, o_at(4 * g + k, r, 1) * inv);
        v[k] = *reinterpret_cast<const uint32_t*>(&pair);
      }
#pragma unroll
      for (int m = 2; m >= 1; m /= 2) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (k & m) continue;
          const uint32_t sent = (q & m) ? v[k] : v[k | m];
          const uint32_t got = __shfl_xor_sync(0xffffffffu, sent, m);
          if (q & m)
            v[k] = got;
          else
            v[k | m] = got;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_a + 8 * r;
    if (row >= p.q_len) continue;  // the quad shares a row: all four store or none
#pragma unroll
    for (int g = 0; g < D / 32; ++g)
      *reinterpret_cast<uint4*>(out_head + row * p.q_stride + (4 * g + q) * 8) = make_uint4(
          pairs[r][4 * g], pairs[r][4 * g + 1], pairs[r][4 * g + 2], pairs[r][4 * g + 3]);
    if (q == 0) lse_head[row] = lse[r];
  }
}

// ---- host side --------------------------------------------------------------------------------

template <class Kernel>
void allow_shared_memory(Kernel kernel, int bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// Blocks along a grid's second dimension are limited to 65535.
inline unsigned grid_blocks(int64_t len, int rows_per_block, const char* what) {
  const int64_t n = (len + rows_per_block - 1) / rows_per_block;
  if (n > 65535) fail("cuda flash attention: ", what, " of ", len, " rows is too long");
  return static_cast<unsigned>(n);
}

inline bool aligned(const void* p, uintptr_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace frugal::cuda::flash
