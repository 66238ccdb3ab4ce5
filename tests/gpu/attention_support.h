// Helpers of the GPU attention tests: bf16 data whose float copy is exact, and the tolerance
// of an attention result computed from the data (see count_bad).
//
// Tolerance, per element: the kernels round P and dS to bf16 before multiplying (relative error
// <= 2^-9 per term), so the error of, say, dV_j = sum_i P_ij dO_i is at most 2^-9 sum_i P_ij
// |dO_i| plus fp32 noise. A float64 pass computes these magnitude sums (sum |term|) for out, dq,
// dk and dv, and each element must be within 2^-7 of its magnitude (4x margin) plus 2^-8 of its
// value (out is stored in bf16) plus 1e-6.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "gpu_support.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"

namespace frugal::test {

inline uint16_t to_bf16(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x = 0;
  std::memcpy(&x, &bits, 4);
  return x;
}

struct Bf16Data {
  std::vector<float> f;
  std::vector<uint16_t> h;
};
inline Bf16Data random_bf16(size_t n, std::mt19937& rng, float amplitude = 1.0f) {
  std::uniform_real_distribution<float> dist(-amplitude, amplitude);
  Bf16Data d;
  d.f.resize(n);
  d.h.resize(n);
  for (size_t i = 0; i < n; ++i) {
    d.h[i] = to_bf16(dist(rng));
    d.f[i] = from_bf16(d.h[i]);
  }
  return d;
}
inline std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// The floats of bf16 bits.
inline std::vector<float> from_bf16(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = from_bf16(h[i]);
  return f;
}

// A case of the attention tests, and its shape (scale 1 / sqrt(head_dim)); window: Mistral's
// sliding window (0: none); key_growth: as attention_problem's.
struct AttentionCase {
  int64_t batch, q_len, kv_len, n_heads, n_kv_heads, head_dim, causal_offset;
  int64_t window = 0;
  float key_growth = 0.0f;
};
// Sliding windows for every attention kernel's test: windows that end inside a tile, shorter
// than a tile (whole tiles skipped on both sides of the band), longer than the sequence, and the
// ring's blocks (offset > 0, blocks partly or wholly outside the window).
// batch, q_len, kv_len, n_heads, n_kv_heads, head_dim, causal_offset, window.
inline const AttentionCase kWindowCases[] = {
    {2, 600, 600, 8, 2, 64, 0, 100},      // band of 100 keys over 5 query blocks
    {1, 700, 700, 8, 1, 128, 0, 37},      // narrower than a key tile, GQA 8:1
    {3, 129, 129, 2, 2, 64, 0, 2},        // each row sees itself and the key before
    {1, 333, 333, 4, 2, 128, 0, 5000},    // window past the sequence: plain causal
    {2, 150, 260, 4, 1, 128, 110, 200},   // a query block after its keys (ring)
    {1, 200, 200, 4, 2, 64, 200, 150},    // the ring's block one chunk back: a corner is seen
    {1, 100, 300, 4, 4, 128, 1000, 900},  // offset past the keys: only the window limits
    {1, 100, 100, 2, 1, 64, 400, 250},    // every key behind every row's window: nothing seen
    {1, 1, 500, 2, 1, 64, 499, 64},       // one decoding row over a cache, window 64
};
inline frugal::cpu::AttentionShape shape_of(const AttentionCase& c) {
  frugal::cpu::AttentionShape s;
  s.batch = c.batch;
  s.q_len = c.q_len;
  s.kv_len = c.kv_len;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  s.causal_offset = c.causal_offset;
  s.window = c.window;
  return s;
}

// Random bf16 inputs of an attention and the CPU kernels' results on them (fp32 on the same
// values): q and k of amplitude 2 (a softmax peaked enough that a wrong mask or max shows), v
// and dout of amplitude 1, random initial gradients the backward accumulates onto (as a ring
// needs), the forward's out and lse, and the backward from out rounded to bf16 (out_in: what
// the kernels' backward gets too) and lse. key_growth > 0 scales key j by 1 + key_growth j /
// kv_len, so that a row's scores grow along the keys (a softmax whose maximum keeps moving).
struct AttentionProblem {
  frugal::cpu::AttentionShape s;
  size_t q_size = 0, kv_size = 0, lse_size = 0;
  Bf16Data q, k, v, dout, out_in;
  std::vector<float> dq0, dk0, dv0, out_ref, lse_ref, dq_ref, dk_ref, dv_ref;
};
inline AttentionProblem attention_problem(const frugal::cpu::AttentionShape& s, unsigned seed,
                                          float key_growth = 0.0f) {
  AttentionProblem t;
  t.s = s;
  t.q_size = static_cast<size_t>(s.batch * s.q_len * s.n_heads * s.head_dim);
  t.kv_size = static_cast<size_t>(s.batch * s.kv_len * s.n_kv_heads * s.head_dim);
  t.lse_size = static_cast<size_t>(s.batch * s.n_heads * s.q_len);
  std::mt19937 rng(seed);
  t.q = random_bf16(t.q_size, rng, 2.0f);
  t.k = random_bf16(t.kv_size, rng, 2.0f);
  if (key_growth > 0.0f) {
    const size_t row = static_cast<size_t>(s.n_kv_heads * s.head_dim);
    for (size_t i = 0; i < t.kv_size; ++i) {
      const auto key = static_cast<float>((i / row) % static_cast<size_t>(s.kv_len));
      t.k.h[i] = to_bf16(t.k.f[i] * (1.0f + key_growth * key / static_cast<float>(s.kv_len)));
      t.k.f[i] = from_bf16(t.k.h[i]);
    }
  }
  t.v = random_bf16(t.kv_size, rng);
  t.dout = random_bf16(t.q_size, rng);
  t.dq0 = random_floats(t.q_size, rng);
  t.dk0 = random_floats(t.kv_size, rng);
  t.dv0 = random_floats(t.kv_size, rng);
  t.out_ref.resize(t.q_size);
  t.lse_ref.resize(t.lse_size);
  frugal::cpu::attention_forward(t.out_ref.data(), t.lse_ref.data(), t.q.f.data(), t.k.f.data(),
                                 t.v.f.data(), s);
  t.out_in.h.resize(t.q_size);
  t.out_in.f.resize(t.q_size);
  for (size_t i = 0; i < t.q_size; ++i) {
    t.out_in.h[i] = to_bf16(t.out_ref[i]);
    t.out_in.f[i] = from_bf16(t.out_in.h[i]);
  }
  t.dq_ref = t.dq0;
  t.dk_ref = t.dk0;
  t.dv_ref = t.dv0;
  frugal::cpu::attention_backward(t.dq_ref.data(), t.dk_ref.data(), t.dv_ref.data(),
                                  t.dout.f.data(), t.q.f.data(), t.k.f.data(), t.v.f.data(),
                                  t.out_in.f.data(), t.lse_ref.data(), s);
  return t;
}

// The problem's bf16 inputs on the GPU.
struct DeviceAttentionInputs {
  explicit DeviceAttentionInputs(const AttentionProblem& t)
      : q(t.q_size), k(t.kv_size), v(t.kv_size), dout(t.q_size), out_in(t.q_size) {
    q.upload(t.q.h);
    k.upload(t.k.h);
    v.upload(t.v.h);
    dout.upload(t.dout.h);
    out_in.upload(t.out_in.h);
  }
  DeviceBuffer<__nv_bfloat16> q, k, v, dout, out_in;
};

// LSE entries off by more than tol (1 + |want|); where want is -inf (a row that sees no key),
// got must be -inf too.
inline int64_t count_bad_lse(const std::vector<float>& got, const std::vector<float>& want,
                             float tol) {
  REQUIRE(got.size() == want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i]))
      bad += !(std::isinf(got[i]) && got[i] < 0);
    else
      bad += !(std::abs(got[i] - want[i]) <= tol * (1.0f + std::abs(want[i])));
  }
  return bad;
}

// Sums of |terms| (float64) of every output element: the scale of its rounding error.
struct Magnitudes {
  std::vector<double> out, dq, dk, dv;
};

inline Magnitudes magnitudes(const frugal::cpu::AttentionShape& s, const std::vector<float>& q,
                             const std::vector<float>& k, const std::vector<float>& v,
                             const std::vector<float>& dout, const std::vector<float>& out) {
  const int64_t D = s.head_dim, group = s.n_heads / s.n_kv_heads;
  Magnitudes m;
  m.out.assign(q.size(), 0.0);
  m.dq.assign(q.size(), 0.0);
  m.dk.assign(k.size(), 0.0);
  m.dv.assign(k.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(s.kv_len)), ds(static_cast<size_t>(s.kv_len));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.n_heads; ++h)
      for (int64_t i = 0; i < s.q_len; ++i) {
        const int64_t g = h / group;
        const int64_t qi = ((b * s.q_len + i) * s.n_heads + h) * D;
        // Causal; the sliding window hides keys window or more positions behind the row, packed
        // documents those of other documents (s.documents: host arrays here).
        const frugal::cpu::VisibleKeys keys = frugal::cpu::visible_keys(b, i, s);
        const int64_t first = keys.first, seen = keys.end;
        if (seen <= first) continue;
        auto kv_at = [&](int64_t j) { return ((b * s.kv_len + j) * s.n_kv_heads + g) * D; };
        double mx = -INFINITY;
        for (int64_t j = first; j < seen; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[qi + d]) * k[kv_at(j) + d];
          p[j] = dot * s.scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = first; j < seen; ++j) sum += std::exp(p[j] - mx);
        // dS_j = P_j (dP_j - Delta), and the fp32 rounding of dP_j - Delta: two sums of D terms
        // that cancel where one key dominates a row (keys growing along the sequence make rows
        // so), each rounded by the CPU reference and by the kernels, D 2^-24 of their terms at
        // most; 2^7 times that here, as the tolerance takes 2^-7 of a magnitude.
        double delta = 0, delta_terms = 0;
        for (int64_t d = 0; d < D; ++d) {
          delta += double(dout[qi + d]) * out[qi + d];
          delta_terms += std::abs(double(dout[qi + d]) * out[qi + d]);
        }
        const double cancelled = 2.0 * static_cast<double>(D) * std::ldexp(1.0, -24 + 7);
        for (int64_t j = first; j < seen; ++j) {
          p[j] = std::exp(p[j] - mx) / sum;
          double dp = 0, dp_terms = 0;
          for (int64_t d = 0; d < D; ++d) {
            dp += double(dout[qi + d]) * v[kv_at(j) + d];
            dp_terms += std::abs(double(dout[qi + d]) * v[kv_at(j) + d]);
          }
          ds[j] = std::abs(p[j] * (dp - delta)) + p[j] * cancelled * (dp_terms + delta_terms);
        }
        for (int64_t j = first; j < seen; ++j) {
          const int64_t kj = kv_at(j);
          for (int64_t d = 0; d < D; ++d) {
            m.out[qi + d] += p[j] * std::abs(v[kj + d]);
            m.dq[qi + d] += s.scale * ds[j] * std::abs(k[kj + d]);
            m.dk[kj + d] += s.scale * ds[j] * std::abs(q[qi + d]);
            m.dv[kj + d] += p[j] * std::abs(dout[qi + d]);
          }
        }
      }
  return m;
}

// Elements outside |got - want| <= 2^-7 magnitude + 2^-8 |want| + 1e-6 (NaN counts as outside).
inline int64_t count_bad(const char* what, const std::vector<float>& got,
                         const std::vector<float>& want, const std::vector<double>& magnitude) {
  REQUIRE(got.size() == want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = std::ldexp(magnitude[i], -7) + std::ldexp(std::abs(want[i]), -8) + 1e-6;
    if (!(std::abs(double(got[i]) - want[i]) <= tol)) {
      if (bad == 0)
        UNSCOPED_INFO(what << "[" << i << "] = " << got[i] << ", want " << want[i] << " +- "
                           << tol);
      ++bad;
    }
  }
  return bad;
}

inline std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// Packed documents of a test (cpu::DocumentMask): for each sequence of the batch, the positions
// where a document begins (ascending, each > 0; none: one document); key row j sits at position
// key_position0 + j of its sequence, query row i at key_position0 + causal_offset + i (a ring's
// block pair when key_position0 > 0). The sequence is as long as its rows reach.
struct DocumentCuts {
  std::vector<std::vector<int>> per_sequence;  // batch entries
  int64_t key_position0 = 0;
};

// The mask's arrays for shape s (its batch, lengths and causal offset), on the host and the GPU.
struct TestDocuments {
  TestDocuments(const frugal::cpu::AttentionShape& s, const DocumentCuts& cuts)
      : key_position0(cuts.key_position0),
        query_doc_start_d(static_cast<size_t>(s.batch * s.q_len)),
        key_doc_end_d(static_cast<size_t>(s.batch * s.kv_len)) {
    REQUIRE(static_cast<int64_t>(cuts.per_sequence.size()) == s.batch);
    const int64_t query_position0 = key_position0 + s.causal_offset;
    REQUIRE(std::min(key_position0, query_position0) >= 0);
    const int64_t length = std::max(key_position0 + s.kv_len, query_position0 + s.q_len);
    for (int64_t b = 0; b < s.batch; ++b) {
      const std::vector<int>& c = cuts.per_sequence[static_cast<size_t>(b)];
      auto start_of = [&](int64_t pos) {
        int64_t start = 0;
        for (int cut : c)
          if (cut <= pos) start = cut;
        return static_cast<int32_t>(start);
      };
      auto end_of = [&](int64_t pos) {
        for (int cut : c)
          if (cut > pos) return static_cast<int32_t>(cut);
        return static_cast<int32_t>(length);
      };
      for (int64_t i = 0; i < s.q_len; ++i)
        query_doc_start.push_back(start_of(query_position0 + i));
      for (int64_t j = 0; j < s.kv_len; ++j) key_doc_end.push_back(end_of(key_position0 + j));
    }
    query_doc_start_d.upload(query_doc_start);
    key_doc_end_d.upload(key_doc_end);
  }
  TestDocuments(const TestDocuments&) = delete;
  TestDocuments& operator=(const TestDocuments&) = delete;

  frugal::cpu::DocumentMask host() const {
    return {query_doc_start.data(), key_doc_end.data(), key_position0};
  }
  frugal::cpu::DocumentMask device() {
    return {query_doc_start_d.get(), key_doc_end_d.get(), key_position0};
  }

  int64_t key_position0;
  std::vector<int32_t> query_doc_start, key_doc_end;  // [batch, q_len], [batch, kv_len]
  DeviceBuffer<int32_t> query_doc_start_d, key_doc_end_d;
};

// Packed documents for every attention kernel's test: one-token documents, documents that
// cross tile boundaries (64, 128 rows) or fill the window, different documents per sequence of a
// batch, GQA, a sliding window over them, and a ring's block pair (keys from position 1000,
// queries after them or overlapping them).
struct DocumentCase {
  AttentionCase shape;
  DocumentCuts cuts;
};
inline std::vector<DocumentCase> document_cases(int64_t head_dim) {
  const int64_t d = head_dim;
  std::vector<int> ones;  // 1-token documents, then one of the rest
  for (int pos = 1; pos <= 40; ++pos) ones.push_back(pos);
  return {
      // batch 2, GQA 4:1: varied lengths, 1-token documents, documents across tile boundaries
      {{2, 600, 600, 8, 2, d, 0}, {{{1, 2, 3, 60, 130, 131, 257, 500}, {64, 65, 300, 599}}}},
      // 1-token documents at the start, then one long document; GQA 2:1
      {{1, 300, 300, 4, 2, d, 0}, {{ones}}},
      // one document filling the window
      {{1, 200, 200, 2, 1, d, 0}, {{std::vector<int>{}}}},
      // a sliding window over documents, some longer than the window, some shorter
      {{2, 500, 500, 4, 1, d, 0, 70}, {{{30, 200, 210, 400}, {1, 250}}}},
      // a ring's block pair: queries after their keys (keys at 1000..1259, queries at 1110..1259)
      {{2, 150, 260, 4, 1, d, 110}, {{{1050, 1120, 1121, 1200}, {990, 1180}}, 1000}},
      // a ring's block one chunk back: keys at 1000..1199, queries at 1200..1399
      {{1, 200, 200, 4, 2, d, 200, 150}, {{{1100, 1250, 1300}}, 1000}},
  };
}

// A kernel on the GPU for check_packed_equals_alone: the forward, and the backward adding fp32
// gradients (into zeros there).
using ForwardRun = std::function<void(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                                      const __nv_bfloat16* k, const __nv_bfloat16* v,
                                      const frugal::cpu::AttentionShape& s)>;
using BackwardRun = std::function<void(
    float* dq, float* dk, float* dv, const __nv_bfloat16* dout, const __nv_bfloat16* q,
    const __nv_bfloat16* k, const __nv_bfloat16* v, const __nv_bfloat16* out, const float* lse,
    const frugal::cpu::AttentionShape& s, float* scratch)>;

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Rows [row0, row0 + n) of sequence b of a [batch, len, width] array.
inline std::vector<float> rows_of(const std::vector<float>& x, int64_t b, int64_t row0, int64_t n,
                                  int64_t len, int64_t width) {
  const auto first = x.begin() + (b * len + row0) * width;
  return std::vector<float>(first, first + n * width);
}
inline std::vector<double> rows_of(const std::vector<double>& x, int64_t b, int64_t row0, int64_t n,
                                   int64_t len, int64_t width, double factor) {
  std::vector<double> r(static_cast<size_t>(n * width));
  for (size_t e = 0; e < r.size(); ++e)
    r[e] = factor * x[static_cast<size_t>((b * len + row0) * width) + e];
  return r;
}
// Rows [row0, row0 + n) of sequence b of a [batch, heads, len] lse, as [heads, n].
inline std::vector<float> lse_rows_of(const std::vector<float>& lse, int64_t b, int64_t row0,
                                      int64_t n, int64_t len, int64_t heads) {
  std::vector<float> r;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i)
      r.push_back(lse[static_cast<size_t>((b * heads + h) * len + row0 + i)]);
  return r;
}

// The packed problem's results against each of its documents run as a sequence of its own (no
// documents, no offset, the case's window), on the same inputs: out, lse, dq, dk, dv within twice
// the tolerance of either against the exact result (the backward of both from the reference's
// out and lse). The case's sequences must start at position 0 (key_position0 0, causal offset 0,
// q_len == kv_len).
inline void check_packed_equals_alone(const DocumentCase& dc, unsigned seed,
                                      const ForwardRun& forward, const BackwardRun& backward) {
  const AttentionCase& c = dc.shape;
  CAPTURE(c.batch, c.q_len, c.n_heads, c.n_kv_heads, c.head_dim, c.window);
  REQUIRE(c.q_len == c.kv_len);
  REQUIRE(c.causal_offset == 0);
  REQUIRE(dc.cuts.key_position0 == 0);
  frugal::cpu::AttentionShape shape = shape_of(c);
  TestDocuments docs(shape, dc.cuts);
  shape.documents = docs.host();
  const AttentionProblem t = attention_problem(shape, seed);
  const Magnitudes mag = magnitudes(t.s, t.q.f, t.k.f, t.v.f, t.dout.f, t.out_in.f);
  DeviceAttentionInputs in(t);
  frugal::cpu::AttentionShape s = t.s;
  s.documents = docs.device();

  // The packed sequences: out and lse of the forward, the gradients from the reference's out
  // and lse (which each document alone gets too).
  DeviceBuffer<__nv_bfloat16> out_d(t.q_size);
  DeviceBuffer<float> lse_d(t.lse_size), dq_d(t.q_size), dk_d(t.kv_size), dv_d(t.kv_size),
      scratch_d(static_cast<size_t>(frugal::cuda::attention_backward_scratch_floats(s)));
  forward(out_d.get(), lse_d.get(), in.q.get(), in.k.get(), in.v.get(), s);
  const std::vector<float> out = from_bf16(out_d.download_bits());
  const std::vector<float> lse = lse_d.download<float>();
  lse_d.upload(t.lse_ref);
  backward(dq_d.get(), dk_d.get(), dv_d.get(), in.dout.get(), in.q.get(), in.k.get(), in.v.get(),
           in.out_in.get(), lse_d.get(), s, scratch_d.get());
  const std::vector<float> dq = dq_d.download<float>(), dk = dk_d.download<float>(),
                           dv = dv_d.download<float>();

  const int64_t L = c.q_len, H = c.n_heads, G = c.n_kv_heads, D = c.head_dim;
  for (int64_t b = 0; b < c.batch; ++b) {
    std::vector<int> bounds = {0};
    for (int cut : dc.cuts.per_sequence[static_cast<size_t>(b)]) bounds.push_back(cut);
    bounds.push_back(static_cast<int>(L));
    for (size_t d = 0; d + 1 < bounds.size(); ++d) {
      const int64_t start = bounds[d], n = bounds[d + 1] - bounds[d];
      CAPTURE(b, start, n);
      const frugal::cpu::AttentionShape one = shape_of({1, n, n, H, G, D, 0, c.window});
      const int64_t q_at = (b * L + start) * H * D, kv_at = (b * L + start) * G * D;
      DeviceBuffer<__nv_bfloat16> out1(static_cast<size_t>(n * H * D));
      DeviceBuffer<float> lse1(static_cast<size_t>(H * n)), dq1(static_cast<size_t>(n * H * D)),
          dk1(static_cast<size_t>(n * G * D)), dv1(static_cast<size_t>(n * G * D)),
          scratch1(static_cast<size_t>(frugal::cuda::attention_backward_scratch_floats(one)));
      forward(out1.get(), lse1.get(), in.q.get() + q_at, in.k.get() + kv_at, in.v.get() + kv_at,
              one);
      CHECK(count_bad("out alone", from_bf16(out1.download_bits()),
                      rows_of(out, b, start, n, L, H * D),
                      rows_of(mag.out, b, start, n, L, H * D, 2.0)) == 0);
      CHECK(count_bad_lse(lse1.download<float>(), lse_rows_of(lse, b, start, n, L, H), 2e-5f) == 0);
      lse1.upload(lse_rows_of(t.lse_ref, b, start, n, L, H));
      backward(dq1.get(), dk1.get(), dv1.get(), in.dout.get() + q_at, in.q.get() + q_at,
               in.k.get() + kv_at, in.v.get() + kv_at, in.out_in.get() + q_at, lse1.get(), one,
               scratch1.get());
      CHECK(count_bad("dq alone", dq1.download<float>(), rows_of(dq, b, start, n, L, H * D),
                      rows_of(mag.dq, b, start, n, L, H * D, 2.0)) == 0);
      CHECK(count_bad("dk alone", dk1.download<float>(), rows_of(dk, b, start, n, L, G * D),
                      rows_of(mag.dk, b, start, n, L, G * D, 2.0)) == 0);
      CHECK(count_bad("dv alone", dv1.download<float>(), rows_of(dv, b, start, n, L, G * D),
                      rows_of(mag.dv, b, start, n, L, G * D, 2.0)) == 0);
    }
  }
}

}  // namespace frugal::test
