// Causal (optionally sliding-window, optionally packed-document) attention with grouped-query
// heads on the GPU: the launchers, which send head dims 64 and 128 to the tensor-core kernels (on
// compute capability 9.0 the Hopper ones of flash_attention_sm90.cu unless the caller says no,
// else flash_attention.cu's; every one of them takes packed documents), and the simple kernels
// that take the other head dims (16 and 32, tiny test models) and unaligned pointers: a fused
// forward (online softmax, K/V tiles in shared memory) and a two-kernel backward
// (dK/dV per key tile, dQ per query tile).
//
// The simple kernels, correct rather than fast (about 7 TFLOP/s):
//  - A query row (forward, dQ) or key row (dK/dV) is owned by `kThreadsPerRow` consecutive
//    lanes, each holding head_dim / kThreadsPerRow of its columns in registers (column
//    sub + kThreadsPerRow * c). Dot products are summed per lane, then across the row's lanes
//    with xor shuffles, so every lane ends with the same value and no shared scratch is needed.
//    Lanes of a warp read the same shared-memory row at consecutive columns: conflict-free.
//  - Forward and dQ: one block per (query tile, head, batch); K and V tiles stream through
//    shared memory; tiles past the last key the tile's last row sees, or before the first key
//    its first row sees (sliding window, packed documents), are never loaded.
//  - dK/dV: one block per (key tile, kv head, batch); it loops over the query rows of every
//    query head sharing the kv head, with Q and dO tiles in shared memory, and starts at the
//    first row that sees the tile's first key (and, under a sliding window or with packed
//    documents, stops after the last row that sees its last key). So each dK/dV element has one
//    writer and the
//    GQA sum over heads happens in registers: no atomics, the result is deterministic.
//  - D_i = rowsum(dO_i * O_i) is recomputed where it is needed instead of a scratch buffer.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_sm90.h"

namespace frugal::cuda {

namespace {

constexpr int kThreads = 128;   // threads per block, every kernel
constexpr int kKeyTile = 32;    // keys per shared-memory tile (forward, dQ)
constexpr int kQueryTile = 32;  // query rows per shared-memory tile (dK/dV)

// Forward and dQ keep three [head_dim / lanes] register arrays per lane (q, acc and the scores
// or dO): 32 columns per lane keeps them in registers at head_dim 128.
template <int D>
struct QueryRowLayout {
  static constexpr int kLanes = D >= 32 ? D / 32 : 1;
  static constexpr int kCols = D / kLanes;
  static constexpr int kRows = kThreads / kLanes;
};
// dK/dV keeps four (k, v, dk, dv): 16 columns per lane.
template <int D>
struct KeyRowLayout {
  static constexpr int kLanes = D >= 16 ? D / 16 : 1;
  static constexpr int kCols = D / kLanes;
  static constexpr int kRows = kThreads / kLanes;
};

// Sum over the kLanes consecutive lanes that own a row; every one of them gets the total.
template <int kLanes>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Keys query row i sees: j <= i + causal_offset, clipped to [0, kv_len].
__device__ __forceinline__ int visible_keys(int64_t i, int64_t causal_offset, int kv_len) {
  const int64_t n = i + causal_offset + 1;
  return n < 0 ? 0 : (n > kv_len ? kv_len : static_cast<int>(n));
}

// The first key query row i sees: with a sliding window (> 0) j > i + causal_offset - window,
// as transformers' sliding_window_overlay; 0 without one.
__device__ __forceinline__ int first_visible_key(int64_t i, int64_t causal_offset, int64_t window,
                                                 int kv_len) {
  if (window <= 0) return 0;
  const int64_t first = i + causal_offset - window + 1;
  return first < 0 ? 0 : (first > kv_len ? kv_len : static_cast<int>(first));
}

// Packed documents (cpu::DocumentMask) as the kernels take them: device arrays [batch, q_len] and
// [batch, kv_len] in positions of the whole sequence, query row i at query_position0 + i (the
// caller's causal_offset included), key row j at key_position0 + j. Null: none.
struct Documents {
  const int32_t* query_doc_start = nullptr;
  const int32_t* key_doc_end = nullptr;
  int64_t key_position0 = 0, query_position0 = 0;
};

Documents documents_of(const AttentionShape& s) {
  if (!s.documents.active()) return {};
  return {s.documents.query_doc_start, s.documents.key_doc_end, s.documents.key_position0,
          s.documents.key_position0 + s.causal_offset};
}

// The first key of its document that query row i (< q_len) of sequence b sees, clipped to
// [0, kv_len]; 0 without documents. Non-decreasing in i.
__device__ __forceinline__ int document_first_key(const Documents& d, int64_t b, int i, int q_len,
                                                  int kv_len) {
  if (d.query_doc_start == nullptr) return 0;
  const int64_t first = d.query_doc_start[b * q_len + i] - d.key_position0;
  return first < 0 ? 0 : (first > kv_len ? kv_len : static_cast<int>(first));
}

// One past the last query row that key j (< kv_len) of sequence b is in the document of, clipped
// to [0, q_len]; q_len without documents. Non-decreasing in j.
__device__ __forceinline__ int document_row_end(const Documents& d, int64_t b, int j, int q_len,
                                                int kv_len) {
  if (d.key_doc_end == nullptr) return q_len;
  const int64_t end = d.key_doc_end[b * kv_len + j] - d.query_position0;
  return end < 0 ? 0 : (end > q_len ? q_len : static_cast<int>(end));
}

// Copies rows [row0, row0 + rows) of one head of a [batch, len, heads, D] bf16 tensor into a
// [rows][D] fp32 shared tile; rows past `len` are zero.
template <int D>
__device__ void load_tile(float (*tile)[D], int rows, const __nv_bfloat16* x, int64_t batch,
                          int row0, int len, int heads, int head) {
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
    const int r = e / D, c = e % D;
    const int row = row0 + r;
    tile[r][c] = row < len
                     ? __bfloat162float(x[((batch * len + row) * heads + head) * int64_t{D} + c])
                     : 0.0f;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                             const __nv_bfloat16* k, const __nv_bfloat16* v, int q_len, int kv_len,
                             int n_heads, int n_kv_heads, float scale, int64_t causal_offset,
                             int64_t window, Documents docs) {
  using L = QueryRowLayout<D>;
  __shared__ float k_tile[kKeyTile][D];
  __shared__ float v_tile[kKeyTile][D];
  const int64_t b = blockIdx.z;
  const int h = blockIdx.y, g = h / (n_heads / n_kv_heads);
  const int q0 = blockIdx.x * L::kRows;
  const int sub = threadIdx.x % L::kLanes;
  const int i = q0 + threadIdx.x / L::kLanes;
  const bool valid = i < q_len;
  const int64_t row_offset = ((b * q_len + i) * n_heads + h) * D;

  float q_reg[L::kCols], acc[L::kCols];
#pragma unroll
  for (int c = 0; c < L::kCols; ++c) {
    q_reg[c] = valid ? __bfloat162float(q[row_offset + sub + L::kLanes * c]) : 0.0f;
    acc[c] = 0.0f;
  }
  const int n_visible = visible_keys(i, causal_offset, kv_len);
  const int first_visible = valid ? max(first_visible_key(i, causal_offset, window, kv_len),
                                        document_first_key(docs, b, i, q_len, kv_len))
                                  : 0;
  // Keys seen by the tile's last row; later key tiles are fully masked and skipped. Under a
  // sliding window or with packed documents, so are the keys before the first one the tile's
  // first row sees.
  const int n_keys = visible_keys(min(q0 + L::kRows, q_len) - 1, causal_offset, kv_len);
  const int k_begin = max(first_visible_key(q0, causal_offset, window, kv_len),
                          document_first_key(docs, b, q0, q_len, kv_len));
  float row_max = -INFINITY, row_sum_exp = 0.0f;

  for (int k0 = k_begin; k0 < n_keys; k0 += kKeyTile) {
    const int tile_keys = min(kKeyTile, n_keys - k0);
    __syncthreads();  // the previous tile is no longer read
    load_tile<D>(k_tile, tile_keys, k, b, k0, kv_len, n_kv_heads, g);
    load_tile<D>(v_tile, tile_keys, v, b, k0, kv_len, n_kv_heads, g);
    __syncthreads();

    float s[kKeyTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeyTile; ++j) {
      if (j < tile_keys) {
        float dot = 0.0f;
#pragma unroll
        for (int c = 0; c < L::kCols; ++c) dot += q_reg[c] * k_tile[j][sub + L::kLanes * c];
        dot = row_sum<L::kLanes>(dot) * scale;
        s[j] = k0 + j < n_visible && k0 + j >= first_visible ? dot : -INFINITY;
      } else {
        s[j] = -INFINITY;
      }
      tile_max = fmaxf(tile_max, s[j]);
    }
    const float new_max = fmaxf(row_max, tile_max);
    if (new_max == -INFINITY) continue;                // this row sees no key yet
    const float correction = expf(row_max - new_max);  // 0 on the first visible tile
    row_sum_exp *= correction;
#pragma unroll
    for (int c = 0; c < L::kCols; ++c) acc[c] *= correction;
#pragma unroll
    for (int j = 0; j < kKeyTile; ++j) {
      if (j < tile_keys) {
        const float p = expf(s[j] - new_max);
        row_sum_exp += p;
#pragma unroll
        for (int c = 0; c < L::kCols; ++c) acc[c] += p * v_tile[j][sub + L::kLanes * c];
      }
    }
    row_max = new_max;
  }

  if (!valid) return;
  const float inv_sum = row_sum_exp > 0.0f ? 1.0f / row_sum_exp : 0.0f;
#pragma unroll
  for (int c = 0; c < L::kCols; ++c)
    out[row_offset + sub + L::kLanes * c] = __float2bfloat16(acc[c] * inv_sum);
  if (sub == 0)
    lse[(b * n_heads + h) * q_len + i] =
        row_sum_exp > 0.0f ? row_max + logf(row_sum_exp) : -INFINITY;
}

// dQ_i += scale * sum_j P_ij (dP_ij - D_i) K_j with P_ij = exp(scale q_i.k_j - lse_i),
// dP_ij = dO_i . v_j. One block per (query tile, head, batch), like the forward.
template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(float* dq, const __nv_bfloat16* dout, const __nv_bfloat16* q,
                                 const __nv_bfloat16* k, const __nv_bfloat16* v,
                                 const __nv_bfloat16* out, const float* lse, int q_len, int kv_len,
                                 int n_heads, int n_kv_heads, float scale, int64_t causal_offset,
                                 int64_t window, Documents docs) {
  using L = QueryRowLayout<D>;
  __shared__ float k_tile[kKeyTile][D];
  __shared__ float v_tile[kKeyTile][D];
  const int64_t b = blockIdx.z;
  const int h = blockIdx.y, g = h / (n_heads / n_kv_heads);
  const int q0 = blockIdx.x * L::kRows;
  const int sub = threadIdx.x % L::kLanes;
  const int i = q0 + threadIdx.x / L::kLanes;
  const bool valid = i < q_len;
  const int64_t row_offset = ((b * q_len + i) * n_heads + h) * D;

  float q_reg[L::kCols], do_reg[L::kCols], acc[L::kCols];
  float row_d = 0.0f;  // D_i = dO_i . O_i
#pragma unroll
  for (int c = 0; c < L::kCols; ++c) {
    const int64_t at = row_offset + sub + L::kLanes * c;
    q_reg[c] = valid ? __bfloat162float(q[at]) : 0.0f;
    do_reg[c] = valid ? __bfloat162float(dout[at]) : 0.0f;
    row_d += do_reg[c] * (valid ? __bfloat162float(out[at]) : 0.0f);
    acc[c] = 0.0f;
  }
  row_d = row_sum<L::kLanes>(row_d);
  const float row_lse = valid ? lse[(b * n_heads + h) * q_len + i] : -INFINITY;
  // A row whose lse is -inf saw no key at all: it has no gradient.
  const int n_visible = row_lse == -INFINITY ? 0 : visible_keys(i, causal_offset, kv_len);
  const int first_visible = valid ? max(first_visible_key(i, causal_offset, window, kv_len),
                                        document_first_key(docs, b, i, q_len, kv_len))
                                  : 0;
  const int n_keys = visible_keys(min(q0 + L::kRows, q_len) - 1, causal_offset, kv_len);
  const int k_begin = max(first_visible_key(q0, causal_offset, window, kv_len),
                          document_first_key(docs, b, q0, q_len, kv_len));

  for (int k0 = k_begin; k0 < n_keys; k0 += kKeyTile) {
    const int tile_keys = min(kKeyTile, n_keys - k0);
    __syncthreads();
    load_tile<D>(k_tile, tile_keys, k, b, k0, kv_len, n_kv_heads, g);
    load_tile<D>(v_tile, tile_keys, v, b, k0, kv_len, n_kv_heads, g);
    __syncthreads();
    for (int j = 0; j < tile_keys; ++j) {
      float score = 0.0f, dp = 0.0f;
#pragma unroll
      for (int c = 0; c < L::kCols; ++c) {
        score += q_reg[c] * k_tile[j][sub + L::kLanes * c];
        dp += do_reg[c] * v_tile[j][sub + L::kLanes * c];
      }
      score = row_sum<L::kLanes>(score);
      dp = row_sum<L::kLanes>(dp);
      if (k0 + j < n_visible && k0 + j >= first_visible) {
        const float ds = expf(score * scale - row_lse) * (dp - row_d);
#pragma unroll
        for (int c = 0; c < L::kCols; ++c) acc[c] += ds * k_tile[j][sub + L::kLanes * c];
      }
    }
  }
  if (!valid || n_visible <= first_visible) return;
#pragma unroll
  for (int c = 0; c < L::kCols; ++c) dq[row_offset + sub + L::kLanes * c] += scale * acc[c];
}

// dV_j += sum_i P_ij dO_i and dK_j += scale * sum_i P_ij (dP_ij - D_i) q_i over every query
// row i of every query head of the group. One block per (key tile, kv head, batch).
template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(float* dk, float* dv, const __nv_bfloat16* dout,
                                   const __nv_bfloat16* q, const __nv_bfloat16* k,
                                   const __nv_bfloat16* v, const __nv_bfloat16* out,
                                   const float* lse, int q_len, int kv_len, int n_heads,
                                   int n_kv_heads, float scale, int64_t causal_offset,
                                   int64_t window, Documents docs) {
  using L = KeyRowLayout<D>;
  __shared__ float q_tile[kQueryTile][D];
  __shared__ float do_tile[kQueryTile][D];
  __shared__ float lse_tile[kQueryTile];
  __shared__ float d_tile[kQueryTile];  // D_i = dO_i . O_i
  const int64_t b = blockIdx.z;
  const int g = blockIdx.y, group = n_heads / n_kv_heads;
  const int j0 = blockIdx.x * L::kRows;
  const int sub = threadIdx.x % L::kLanes;
  const int j = j0 + threadIdx.x / L::kLanes;
  const bool valid = j < kv_len;
  const int64_t row_offset = ((b * kv_len + j) * n_kv_heads + g) * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  float k_reg[L::kCols], v_reg[L::kCols], dk_acc[L::kCols], dv_acc[L::kCols];
#pragma unroll
  for (int c = 0; c < L::kCols; ++c) {
    k_reg[c] = valid ? __bfloat162float(k[row_offset + sub + L::kLanes * c]) : 0.0f;
    v_reg[c] = valid ? __bfloat162float(v[row_offset + sub + L::kLanes * c]) : 0.0f;
    dk_acc[c] = 0.0f;
    dv_acc[c] = 0.0f;
  }
  // Row i sees key j0 iff j0 <= i + causal_offset: earlier rows see none of this tile.
  const int64_t first_row = std::max<int64_t>(0, j0 - causal_offset);
  const int i_first = static_cast<int>(std::min<int64_t>(first_row, q_len));
  // Under a sliding window, rows from i_end on are window or more past the tile's last key; with
  // packed documents, past the end of its document.
  const int last_key = min(j0 + L::kRows, kv_len) - 1;
  const int i_end =
      min(window > 0 ? static_cast<int>(std::min<int64_t>(
                           std::max<int64_t>(last_key - causal_offset + window, 0), q_len))
                     : q_len,
          document_row_end(docs, b, last_key, q_len, kv_len));
  // Rows from here on are outside key j's document.
  const int doc_end = valid ? document_row_end(docs, b, j, q_len, kv_len) : 0;

  for (int h = g * group; h < (g + 1) * group; ++h) {
    for (int i0 = i_first; i0 < i_end; i0 += kQueryTile) {
      const int tile_rows = min(kQueryTile, i_end - i0);
      __syncthreads();
      load_tile<D>(q_tile, tile_rows, q, b, i0, q_len, n_heads, h);
      load_tile<D>(do_tile, tile_rows, dout, b, i0, q_len, n_heads, h);
      // One warp per row for D_i, lanes over columns, then a fixed shuffle tree.
      for (int r = warp; r < tile_rows; r += kThreads / 32) {
        const int64_t at = ((b * q_len + i0 + r) * n_heads + h) * D;
        float sum = 0.0f;
        for (int c = lane; c < D; c += 32)
          sum += __bfloat162float(dout[at + c]) * __bfloat162float(out[at + c]);
        sum = row_sum<32>(sum);
        if (lane == 0) {
          d_tile[r] = sum;
          lse_tile[r] = lse[(b * n_heads + h) * q_len + i0 + r];
        }
      }
      __syncthreads();
      for (int r = 0; r < tile_rows; ++r) {
        float score = 0.0f, dp = 0.0f;
#pragma unroll
        for (int c = 0; c < L::kCols; ++c) {
          score += k_reg[c] * q_tile[r][sub + L::kLanes * c];
          dp += v_reg[c] * do_tile[r][sub + L::kLanes * c];
        }
        score = row_sum<L::kLanes>(score);
        dp = row_sum<L::kLanes>(dp);
        const float row_lse = lse_tile[r];
        const int64_t behind = i0 + r + causal_offset - j;  // 0: the row's own position
        if (valid && behind >= 0 && (window <= 0 || behind < window) && i0 + r < doc_end &&
            row_lse != -INFINITY) {
          const float p = expf(score * scale - row_lse);
          const float ds = p * (dp - d_tile[r]);
#pragma unroll
          for (int c = 0; c < L::kCols; ++c) {
            dv_acc[c] += p * do_tile[r][sub + L::kLanes * c];
            dk_acc[c] += ds * q_tile[r][sub + L::kLanes * c];
          }
        }
      }
    }
  }
  if (!valid) return;
#pragma unroll
  for (int c = 0; c < L::kCols; ++c) {
    dk[row_offset + sub + L::kLanes * c] += scale * dk_acc[c];
    dv[row_offset + sub + L::kLanes * c] += dv_acc[c];
  }
}

void check_shape(const AttentionShape& s) {
  if (s.batch < 0 || s.q_len < 0 || s.kv_len < 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 ||
      s.n_heads % s.n_kv_heads != 0 || s.window < 0)
    fail("cuda attention: bad shape batch ", s.batch, " q_len ", s.q_len, " kv_len ", s.kv_len,
         " n_heads ", s.n_heads, " n_kv_heads ", s.n_kv_heads, " window ", s.window);
  if (!attention_supports_head_dim(s.head_dim))
    fail("cuda attention: head_dim ", s.head_dim, " is not supported (16, 32, 64 or 128)");
  // Row indices are int inside the kernels; grid.y and grid.z are limited to 65535.
  if (s.q_len > INT32_MAX / 2 || s.kv_len > INT32_MAX / 2 || s.n_heads > 65535 || s.batch > 65535)
    fail("cuda attention: shape too large: q_len ", s.q_len, " kv_len ", s.kv_len, " n_heads ",
         s.n_heads, " batch ", s.batch);
}

template <int D>
void forward_for(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                 const __nv_bfloat16* v, const AttentionShape& s, cudaStream_t stream) {
  const int rows = QueryRowLayout<D>::kRows;
  const dim3 grid(static_cast<unsigned>((s.q_len + rows - 1) / rows),
                  static_cast<unsigned>(s.n_heads), static_cast<unsigned>(s.batch));
  attention_forward_kernel<D><<<grid, kThreads, 0, stream>>>(
      out, lse, q, k, v, static_cast<int>(s.q_len), static_cast<int>(s.kv_len),
      static_cast<int>(s.n_heads), static_cast<int>(s.n_kv_heads), s.scale, s.causal_offset,
      s.window, documents_of(s));
  CUDA_CHECK_LAUNCH();
}

template <int D>
void backward_for(float* dq, float* dk, float* dv, const __nv_bfloat16* dout,
                  const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                  const __nv_bfloat16* out, const float* lse, const AttentionShape& s,
                  cudaStream_t stream) {
  const int q_rows = QueryRowLayout<D>::kRows, k_rows = KeyRowLayout<D>::kRows;
  const int q_len = static_cast<int>(s.q_len), kv_len = static_cast<int>(s.kv_len);
  const int n_heads = static_cast<int>(s.n_heads), n_kv_heads = static_cast<int>(s.n_kv_heads);
  const dim3 dkdv_grid(static_cast<unsigned>((s.kv_len + k_rows - 1) / k_rows),
                       static_cast<unsigned>(s.n_kv_heads), static_cast<unsigned>(s.batch));
  attention_backward_dkdv_kernel<D><<<dkdv_grid, kThreads, 0, stream>>>(
      dk, dv, dout, q, k, v, out, lse, q_len, kv_len, n_heads, n_kv_heads, s.scale, s.causal_offset,
      s.window, documents_of(s));
  CUDA_CHECK_LAUNCH();
  const dim3 dq_grid(static_cast<unsigned>((s.q_len + q_rows - 1) / q_rows),
                     static_cast<unsigned>(s.n_heads), static_cast<unsigned>(s.batch));
  attention_backward_dq_kernel<D><<<dq_grid, kThreads, 0, stream>>>(
      dq, dout, q, k, v, out, lse, q_len, kv_len, n_heads, n_kv_heads, s.scale, s.causal_offset,
      s.window, documents_of(s));
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_supports_head_dim(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

int64_t attention_backward_scratch_floats(const AttentionShape& s) {
  return flash_attention_backward_scratch_floats(s);
}

void attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                       const __nv_bfloat16* k, const __nv_bfloat16* v, const AttentionShape& s,
                       bool allow_sm90, cudaStream_t stream) {
  check_shape(s);
  if (s.batch == 0 || s.q_len == 0) return;
  if (allow_sm90 && flash_attention_sm90_supports(s, {out, q, k, v}, {}))
    return flash_attention_sm90_forward(out, lse, q, k, v, s, stream);
  if (flash_attention_supports(s, {out, q, k, v}, {}))
    return flash_attention_forward(out, lse, q, k, v, s, stream);
  switch (s.head_dim) {
    case 16:
      return forward_for<16>(out, lse, q, k, v, s, stream);
    case 32:
      return forward_for<32>(out, lse, q, k, v, s, stream);
    case 64:
      return forward_for<64>(out, lse, q, k, v, s, stream);
    default:
      return forward_for<128>(out, lse, q, k, v, s, stream);
  }
}

void attention_backward(float* dq, float* dk, float* dv, const __nv_bfloat16* dout,
                        const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                        const __nv_bfloat16* out, const float* lse, const AttentionShape& s,
                        float* scratch, bool allow_sm90, cudaStream_t stream) {
  check_shape(s);
  if (s.batch == 0 || s.q_len == 0 || s.kv_len == 0) return;
  if (allow_sm90 && flash_attention_sm90_supports(s, {dout, q, k, v, out}, {dq, dk, dv}))
    return flash_attention_sm90_backward(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
  if (flash_attention_supports(s, {dout, q, k, v, out}, {dq, dk, dv}))
    return flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
  switch (s.head_dim) {
    case 16:
      return backward_for<16>(dq, dk, dv, dout, q, k, v, out, lse, s, stream);
    case 32:
      return backward_for<32>(dq, dk, dv, dout, q, k, v, out, lse, s, stream);
    case 64:
      return backward_for<64>(dq, dk, dv, dout, q, k, v, out, lse, s, stream);
    default:
      return backward_for<128>(dq, dk, dv, dout, q, k, v, out, lse, s, stream);
  }
}

bool attention_backward_writes_bf16(const AttentionShape& s,
                                    std::initializer_list<const void*> bf16_tensors,
                                    bool allow_sm90) {
  return allow_sm90 && flash_attention_sm90_supports(s, bf16_tensors, {});
}

void attention_backward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                        const __nv_bfloat16* dout, const __nv_bfloat16* q, const __nv_bfloat16* k,
                        const __nv_bfloat16* v, const __nv_bfloat16* out, const float* lse,
                        const AttentionShape& s, float* scratch, bool allow_sm90,
                        cudaStream_t stream) {
  check_shape(s);
  FRUGAL_CHECK(allow_sm90 && flash_attention_sm90_supports(s, {dout, q, k, v, out, dq, dk, dv}, {}),
               "cuda attention backward: bf16 gradients need the Hopper kernels (sm_90, head dim "
               "64 or 128, 16-byte aligned tensors)");
  flash_attention_sm90_backward(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
}

}  // namespace frugal::cuda
