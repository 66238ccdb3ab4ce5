// Helpers of the GPU attention tests: bf16 data whose float copy is exact, and the tolerance
// of an attention result computed from the data (see count_bad).
//
// Tolerance, per element: the kernels round P and dS to bf16 before multiplying (relative error
// <= 2^-9 per term), so the error of, say, dV_j = sum_i P_ij dO_i is at most 2^-9 sum_i P_ij
// |dO_i| plus fp32 noise. A float64 pass computes these magnitude sums (sum |term|) for out, dq,
// dk and dv, and each element must be within 2^-7 of its magnitude (4x margin) plus 2^-8 of its
// value (out is stored in bf16) plus 1e-6.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "kernels/cpu/attention.h"

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
inline Bf16Data random_bf16(size_t n, std::mt19937& rng, float amplitude) {
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
        const int64_t seen = std::clamp<int64_t>(i + s.causal_offset + 1, 0, s.kv_len);
        if (seen == 0) continue;
        auto kv_at = [&](int64_t j) { return ((b * s.kv_len + j) * s.n_kv_heads + g) * D; };
        double mx = -INFINITY;
        for (int64_t j = 0; j < seen; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[qi + d]) * k[kv_at(j) + d];
          p[j] = dot * s.scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < seen; ++j) sum += std::exp(p[j] - mx);
        double delta = 0;
        for (int64_t d = 0; d < D; ++d) delta += double(dout[qi + d]) * out[qi + d];
        for (int64_t j = 0; j < seen; ++j) {
          p[j] = std::exp(p[j] - mx) / sum;
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += double(dout[qi + d]) * v[kv_at(j) + d];
          ds[j] = std::abs(p[j] * (dp - delta));
        }
        for (int64_t j = 0; j < seen; ++j) {
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

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace frugal::test
