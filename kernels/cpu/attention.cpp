// Causal (optionally sliding-window, optionally document-masked) scaled-dot-product attention with
// grouped-query heads on the CPU: the forward returns the per-row log-sum-exp, the backward
// recomputes the probabilities from it. Each row only touches the keys it sees, so a window W
// costs O(S * W), and packed documents of length L O(S * L).
//
// Layout choices, for cache and vectorisation without -ffast-math:
//  - K (and in the backward V) are first transposed per (batch, kv head) into [head_dim, kv_len],
//    so a row of scores s_j = q . k_j is built as head_dim axpys over contiguous j (the compiler
//    vectorises an axpy, but not a float dot product, whose order it may not change).
//  - Sums over keys (out = P V, dq = dS K) are axpys over head_dim on contiguous rows of V, K.
//  - Every output element is written by one thread and summed in a fixed order, so results do
//    not depend on the thread count. The backward therefore runs two passes: one parallel over
//    (batch, kv head, key block) for dk and dv, one parallel over query rows for dq. It
//    recomputes the scores in both (7 row-matrix products instead of 5) in exchange for full
//    parallelism without atomics, even with one kv head and batch 1.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace frugal::cpu {

namespace {

// Keys per task in the dk/dv pass: the task keeps [kKeyBlock, head_dim] accumulators for dk
// and dv (2 * 64 * 128 * 4 bytes = 64 KiB at head_dim 128), small enough for L2.
constexpr int64_t kKeyBlock = 64;

void check_shape(const AttentionShape& s) {
  FRUGAL_CHECK(s.batch >= 0 && s.q_len >= 0 && s.kv_len >= 0 && s.head_dim > 0,
               "attention shape batch ", s.batch, " q_len ", s.q_len, " kv_len ", s.kv_len,
               " head_dim ", s.head_dim);
  FRUGAL_CHECK(s.n_kv_heads > 0 && s.n_heads > 0 && s.n_heads % s.n_kv_heads == 0,
               "attention n_heads ", s.n_heads, " is not a multiple of n_kv_heads ", s.n_kv_heads);
  FRUGAL_CHECK(s.window >= 0, "attention window ", s.window, " is negative");
}

// x: [batch, kv_len, n_kv_heads, head_dim] -> xt: [batch, n_kv_heads, head_dim, kv_len]
std::vector<float> transpose_kv(const float* x, const AttentionShape& s) {
  const int64_t T = s.kv_len, G = s.n_kv_heads, D = s.head_dim;
  std::vector<float> xt(static_cast<size_t>(s.batch * G * D * T));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < G; ++g) {
      float* dst = xt.data() + (b * G + g) * D * T;
      for (int64_t j = 0; j < T; ++j) {
        const float* src = x + ((b * T + j) * G + g) * D;
        for (int64_t d = 0; d < D; ++d) dst[d * T + j] = src[d];
      }
    }
  }
  return xt;
}

// out[j - j0] = scale * sum_d q[d] * xt[d * stride + j] for j in [j0, j1). Summing over d in
// the same order for every j keeps forward and backward scores identical. Four rows of xt per
// pass over `out` quarter its loads and stores.
void row_dots(float* out, const float* q, const float* xt, int64_t stride, int64_t j0, int64_t j1,
              int64_t D, float scale) {
  const int64_t n = j1 - j0;
  std::fill(out, out + n, 0.0f);
  int64_t d = 0;
  for (; d + 4 <= D; d += 4) {
    const float q0 = q[d], q1 = q[d + 1], q2 = q[d + 2], q3 = q[d + 3];
    const float* r0 = xt + d * stride + j0;
    const float* r1 = r0 + stride;
    const float* r2 = r1 + stride;
    const float* r3 = r2 + stride;
    for (int64_t j = 0; j < n; ++j) out[j] += (q0 * r0[j] + q1 * r1[j]) + (q2 * r2[j] + q3 * r3[j]);
  }
  for (; d < D; ++d) {
    const float qd = q[d];
    const float* row = xt + d * stride + j0;
    for (int64_t j = 0; j < n; ++j) out[j] += qd * row[j];
  }
  for (int64_t j = 0; j < n; ++j) out[j] *= scale;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& s) {
  check_shape(s);
  const int64_t B = s.batch, Tq = s.q_len, Tk = s.kv_len, H = s.n_heads, G = s.n_kv_heads;
  const int64_t D = s.head_dim, group = H / G;
  const std::vector<float> kt = transpose_kv(k, s);

#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(Tk));
    std::vector<float> acc(static_cast<size_t>(D));
    // Rows differ in cost (causal), hence dynamic; each row is still computed by one thread.
#pragma omp for collapse(3) schedule(dynamic, 4)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < Tq; ++i) {
          const int64_t g = h / group;
          float* out_row = out + ((b * Tq + i) * H + h) * D;
          float* lse_row = lse + (b * H + h) * Tq + i;
          const VisibleKeys keys = visible_keys(b, i, s);
          const int64_t n = keys.end - keys.first;
          if (n <= 0) {
            std::fill(out_row, out_row + D, 0.0f);
            *lse_row = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float* q_row = q + ((b * Tq + i) * H + h) * D;
          row_dots(p.data(), q_row, kt.data() + (b * G + g) * D * Tk, Tk, keys.first, keys.end, D,
                   s.scale);
          const float max = *std::max_element(p.data(), p.data() + n);
          float sum = 0.0f;
          for (int64_t j = 0; j < n; ++j) {
            p[j] = std::exp(p[j] - max);
            sum += p[j];
          }
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = 0; j < n; ++j) {
            const float pj = p[j];
            const float* v_row = v + ((b * Tk + keys.first + j) * G + g) * D;
            for (int64_t d = 0; d < D; ++d) acc[d] += pj * v_row[d];
          }
          const float inv_sum = 1.0f / sum;
          for (int64_t d = 0; d < D; ++d) out_row[d] = acc[d] * inv_sum;
          *lse_row = max + std::log(sum);
        }
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& s) {
  check_shape(s);
  const int64_t B = s.batch, Tq = s.q_len, Tk = s.kv_len, H = s.n_heads, G = s.n_kv_heads;
  const int64_t D = s.head_dim, group = H / G;
  const std::vector<float> kt = transpose_kv(k, s);
  const std::vector<float> vt = transpose_kv(v, s);

  // D_i = rowsum(dout_i * out_i), laid out like lse: [batch, n_heads, q_len].
  std::vector<float> row_dot(static_cast<size_t>(B * H * Tq));
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t off = ((b * Tq + i) * H + h) * D;
        float acc = 0.0f;
        for (int64_t d = 0; d < D; ++d) acc += dout[off + d] * out[off + d];
        row_dot[(b * H + h) * Tq + i] = acc;
      }
    }
  }

  // Pass 1: dk and dv, one task per (batch, kv head, block of keys). The task visits every
  // query row of every query head in the group that sees a key of its block.
  const int64_t n_key_blocks = (Tk + kKeyBlock - 1) / kKeyBlock;
#pragma omp parallel
  {
    std::vector<float> p(kKeyBlock), dp(kKeyBlock);
    std::vector<float> dk_acc(static_cast<size_t>(kKeyBlock * D));
    std::vector<float> dv_acc(static_cast<size_t>(kKeyBlock * D));
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t kb = 0; kb < n_key_blocks; ++kb) {
          const int64_t j0 = kb * kKeyBlock;
          const int64_t j1 = std::min(Tk, j0 + kKeyBlock);
          const float* kt_g = kt.data() + (b * G + g) * D * Tk;
          const float* vt_g = vt.data() + (b * G + g) * D * Tk;
          std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
          std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
          // The rows that see a key of [j0, j1): from the first that sees j0 to the last that
          // sees one of them. Rows past the window or the keys' documents are never visited:
          // O(S * window) work, O(S * document) with packed documents.
          const int64_t i_first = visible_rows(b, j0, s).first;
          int64_t i_end = 0;
          for (int64_t j = j0; j < j1; ++j) i_end = std::max(i_end, visible_rows(b, j, s).end);
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            for (int64_t i = i_first; i < i_end; ++i) {
              const VisibleKeys keys = visible_keys(b, i, s);
              const int64_t j_begin = std::max(j0, keys.first);
              const int64_t j_end = std::min(j1, keys.end);
              if (j_end <= j_begin) continue;
              const int64_t n = j_end - j_begin;
              const int64_t off = ((b * Tq + i) * H + h) * D;
              const float* q_row = q + off;
              const float* do_row = dout + off;
              const float row_lse = lse[(b * H + h) * Tq + i];
              const float row_d = row_dot[(b * H + h) * Tq + i];
              row_dots(p.data(), q_row, kt_g, Tk, j_begin, j_end, D, s.scale);
              row_dots(dp.data(), do_row, vt_g, Tk, j_begin, j_end, D, 1.0f);
              for (int64_t j = 0; j < n; ++j) {
                const float pj = std::exp(p[j] - row_lse);
                const float dsj = s.scale * pj * (dp[j] - row_d);  // scale * dS_ij
                float* dv_row = dv_acc.data() + (j_begin - j0 + j) * D;
                float* dk_row = dk_acc.data() + (j_begin - j0 + j) * D;
                for (int64_t d = 0; d < D; ++d) dv_row[d] += pj * do_row[d];
                for (int64_t d = 0; d < D; ++d) dk_row[d] += dsj * q_row[d];
              }
            }
          }
          for (int64_t j = j0; j < j1; ++j) {
            const int64_t off = ((b * Tk + j) * G + g) * D;
            const float* dk_row = dk_acc.data() + (j - j0) * D;
            const float* dv_row = dv_acc.data() + (j - j0) * D;
            for (int64_t d = 0; d < D; ++d) dk[off + d] += dk_row[d];
            for (int64_t d = 0; d < D; ++d) dv[off + d] += dv_row[d];
          }
        }
      }
    }
  }

  // Pass 2: dq, one task per query row.
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(Tk)), dp(static_cast<size_t>(Tk));
    std::vector<float> acc(static_cast<size_t>(D));
#pragma omp for collapse(3) schedule(dynamic, 4)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < Tq; ++i) {
          const VisibleKeys keys = visible_keys(b, i, s);
          const int64_t n = keys.end - keys.first;
          if (n <= 0) continue;  // a row that sees nothing has no gradient
          const int64_t g = h / group;
          const int64_t off = ((b * Tq + i) * H + h) * D;
          const float row_lse = lse[(b * H + h) * Tq + i];
          const float row_d = row_dot[(b * H + h) * Tq + i];
          row_dots(p.data(), q + off, kt.data() + (b * G + g) * D * Tk, Tk, keys.first, keys.end, D,
                   s.scale);
          row_dots(dp.data(), dout + off, vt.data() + (b * G + g) * D * Tk, Tk, keys.first,
                   keys.end, D, 1.0f);
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = 0; j < n; ++j) {
            const float dsj = std::exp(p[j] - row_lse) * (dp[j] - row_d);
            const float* k_row = k + ((b * Tk + keys.first + j) * G + g) * D;
            for (int64_t d = 0; d < D; ++d) acc[d] += dsj * k_row[d];
          }
          for (int64_t d = 0; d < D; ++d) dq[off + d] += s.scale * acc[d];
        }
      }
    }
  }
}

}  // namespace frugal::cpu
