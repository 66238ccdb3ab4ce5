// The tensor-core attention kernels (head dims 64 and 128) against the CPU kernel on awkward
// shapes: sequences that are not tile multiples, GQA 4:1 and 8:1, q_len != kv_len with positive
// and negative causal offsets, batch > 1; both backward tilings; bitwise reproducibility.
//
// Tolerance, per element and computed from the data: the kernels round P and dS to bf16 before
// multiplying (relative error <= 2^-9 per term), so the error of, say, dV_j = sum_i P_ij dO_i is
// at most 2^-9 sum_i P_ij |dO_i| plus fp32 noise. A float64 pass computes these magnitude sums
// (sum |term|) for out, dq, dk and dv, and each element must be within 2^-7 of its magnitude
// (4x margin) plus 2^-8 of its value (out is stored in bf16) plus 1e-6.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "gpu_support.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"

namespace {

using Bf16 = __nv_bfloat16;
using frugal::test::DeviceBuffer;

uint16_t to_bf16(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x = 0;
  std::memcpy(&x, &bits, 4);
  return x;
}

struct Bf16Data {
  std::vector<float> f;
  std::vector<uint16_t> h;
};
Bf16Data random_bf16(size_t n, std::mt19937& rng, float amplitude) {
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
std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Sums of |terms| (float64) of every output element: the scale of its rounding error.
struct Magnitudes {
  std::vector<double> out, dq, dk, dv;
};

Magnitudes magnitudes(const frugal::cpu::AttentionShape& s, const std::vector<float>& q,
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
int64_t count_bad(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<double>& magnitude) {
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

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct Case {
  int64_t batch, q_len, kv_len, n_heads, n_kv_heads, head_dim, causal_offset;
};

void check_case(const Case& c) {
  frugal::cpu::AttentionShape s;
  s.batch = c.batch;
  s.q_len = c.q_len;
  s.kv_len = c.kv_len;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  s.causal_offset = c.causal_offset;
  CAPTURE(c.batch, c.q_len, c.kv_len, c.n_heads, c.n_kv_heads, c.head_dim, c.causal_offset);

  const size_t q_size = static_cast<size_t>(s.batch * s.q_len * s.n_heads * s.head_dim);
  const size_t kv_size = static_cast<size_t>(s.batch * s.kv_len * s.n_kv_heads * s.head_dim);
  const size_t lse_size = static_cast<size_t>(s.batch * s.n_heads * s.q_len);
  std::mt19937 rng(static_cast<unsigned>(c.q_len * 1009 + c.kv_len * 31 + c.head_dim +
                                         c.n_kv_heads * 7 + c.causal_offset));
  // Amplitude 2 makes the softmax peaked enough that a wrong mask or max shows.
  const Bf16Data q = random_bf16(q_size, rng, 2.0f), k = random_bf16(kv_size, rng, 2.0f);
  const Bf16Data v = random_bf16(kv_size, rng, 1.0f), dout = random_bf16(q_size, rng, 1.0f);
  const std::vector<float> dq0 = random_floats(q_size, rng), dk0 = random_floats(kv_size, rng),
                           dv0 = random_floats(kv_size, rng);

  std::vector<float> out_ref(q_size), lse_ref(lse_size);
  frugal::cpu::attention_forward(out_ref.data(), lse_ref.data(), q.f.data(), k.f.data(), v.f.data(),
                                 s);
  // The backward on both sides gets the same out (the reference's, rounded to bf16) and lse.
  Bf16Data out_in;
  out_in.h.resize(q_size);
  out_in.f.resize(q_size);
  for (size_t i = 0; i < q_size; ++i) {
    out_in.h[i] = to_bf16(out_ref[i]);
    out_in.f[i] = from_bf16(out_in.h[i]);
  }
  std::vector<float> dq_ref = dq0, dk_ref = dk0, dv_ref = dv0;
  frugal::cpu::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.f.data(),
                                  q.f.data(), k.f.data(), v.f.data(), out_in.f.data(),
                                  lse_ref.data(), s);
  const Magnitudes mag = magnitudes(s, q.f, k.f, v.f, dout.f, out_in.f);

  DeviceBuffer<Bf16> q_d(q_size), k_d(kv_size), v_d(kv_size), out_d(q_size), dout_d(q_size),
      out_in_d(q_size);
  DeviceBuffer<float> lse_d(lse_size), dq_d(q_size), dk_d(kv_size), dv_d(kv_size),
      scratch_d(static_cast<size_t>(frugal::cuda::attention_backward_scratch_floats(s)));
  q_d.upload(q.h);
  k_d.upload(k.h);
  v_d.upload(v.h);
  dout_d.upload(dout.h);
  out_in_d.upload(out_in.h);
  const cudaStream_t stream = nullptr;
  REQUIRE(
      frugal::cuda::flash_attention_supports(s, {q_d.get(), k_d.get(), v_d.get()}, {dq_d.get()}));

  // Forward into poisoned buffers (bf16 and fp32 NaN): every element must be written.
  CUDA_CHECK(cudaMemset(out_d.get(), 0xff, q_size * sizeof(Bf16)));
  CUDA_CHECK(cudaMemset(lse_d.get(), 0xff, lse_size * sizeof(float)));
  frugal::cuda::attention_forward(out_d.get(), lse_d.get(), q_d.get(), k_d.get(), v_d.get(), s,
                                  stream);
  const auto out_bits = out_d.download_bits();
  const auto lse = lse_d.download<float>();
  std::vector<float> out(q_size);
  for (size_t i = 0; i < q_size; ++i) out[i] = from_bf16(out_bits[i]);
  CHECK(count_bad("out", out, out_ref, mag.out) == 0);
  int64_t lse_bad = 0;
  for (size_t i = 0; i < lse_size; ++i) {
    if (std::isinf(lse_ref[i]))
      lse_bad += !(std::isinf(lse[i]) && lse[i] < 0);
    else
      lse_bad += !(std::abs(lse[i] - lse_ref[i]) <= 1e-5f * (1.0f + std::abs(lse_ref[i])));
  }
  CHECK(lse_bad == 0);

  // Backward, both tilings, accumulating onto random initial gradients.
  lse_d.upload(lse_ref);
  for (const auto tiles : {frugal::cuda::FlashBackwardTiles::kLargeSmem,
                           frugal::cuda::FlashBackwardTiles::kSmallSmem}) {
    CAPTURE(tiles == frugal::cuda::FlashBackwardTiles::kLargeSmem ? "large smem" : "small smem");
    dq_d.upload(dq0);
    dk_d.upload(dk0);
    dv_d.upload(dv0);
    frugal::cuda::flash_attention_backward(dq_d.get(), dk_d.get(), dv_d.get(), dout_d.get(),
                                           q_d.get(), k_d.get(), v_d.get(), out_in_d.get(),
                                           lse_d.get(), s, scratch_d.get(), stream, tiles);
    CHECK(count_bad("dq", minus(dq_d.download<float>(), dq0), minus(dq_ref, dq0), mag.dq) == 0);
    CHECK(count_bad("dk", minus(dk_d.download<float>(), dk0), minus(dk_ref, dk0), mag.dk) == 0);
    CHECK(count_bad("dv", minus(dv_d.download<float>(), dv0), minus(dv_ref, dv0), mag.dv) == 0);
  }

  // Reproducibility: the public launchers twice give bitwise the same results.
  std::vector<uint16_t> out_runs[2];
  std::vector<float> lse_runs[2], dq_runs[2], dk_runs[2], dv_runs[2];
  for (int run = 0; run < 2; ++run) {
    frugal::cuda::attention_forward(out_d.get(), lse_d.get(), q_d.get(), k_d.get(), v_d.get(), s,
                                    stream);
    out_runs[run] = out_d.download_bits();
    lse_runs[run] = lse_d.download<float>();
    dq_d.upload(dq0);
    dk_d.upload(dk0);
    dv_d.upload(dv0);
    frugal::cuda::attention_backward(dq_d.get(), dk_d.get(), dv_d.get(), dout_d.get(), q_d.get(),
                                     k_d.get(), v_d.get(), out_d.get(), lse_d.get(), s,
                                     scratch_d.get(), stream);
    dq_runs[run] = dq_d.download<float>();
    dk_runs[run] = dk_d.download<float>();
    dv_runs[run] = dv_d.download<float>();
  }
  CHECK(bitwise_equal(out_runs[0], out_bits));
  CHECK(bitwise_equal(out_runs[1], out_bits));
  CHECK(bitwise_equal(lse_runs[0], lse_runs[1]));
  CHECK(bitwise_equal(dq_runs[0], dq_runs[1]));
  CHECK(bitwise_equal(dk_runs[0], dk_runs[1]));
  CHECK(bitwise_equal(dv_runs[0], dv_runs[1]));
}

}  // namespace

TEST_CASE("cuda flash attention matches the CPU on awkward shapes", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  // batch, q_len, kv_len, n_heads, n_kv_heads, head_dim, causal_offset
  const Case cases[] = {
      {2, 200, 200, 8, 2, 64, 0},      // GQA 4:1, seq not a tile multiple
      {1, 333, 333, 8, 1, 128, 0},     // GQA 8:1
      {3, 129, 129, 2, 2, 64, 0},      // batch 3, one row past a tile
      {1, 260, 140, 8, 2, 128, 0},     // q_len > kv_len: the last rows see every key
      {2, 150, 260, 4, 1, 128, 110},   // a query block after its keys (ring)
      {1, 190, 130, 4, 2, 64, -70},    // negative offset: the first 70 rows see nothing
      {1, 100, 300, 4, 4, 128, 1000},  // offset past the keys: no mask
      {1, 70, 90, 2, 1, 128, -100},    // no row sees a key
      {1, 1, 200, 2, 1, 64, 199},      // one decoding row over many keys
      {1, 300, 77, 4, 1, 64, -150},    // keys ending before most rows start seeing them
  };
  for (const Case& c : cases) check_case(c);
}

TEST_CASE("cuda flash attention backward needs its scratch", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  frugal::cpu::AttentionShape s;
  s.batch = 1;
  s.q_len = s.kv_len = 64;
  s.n_heads = s.n_kv_heads = 1;
  s.head_dim = 64;
  s.scale = 0.125f;
  CHECK(frugal::cuda::attention_backward_scratch_floats(s) == 2 * 64);
  DeviceBuffer<Bf16> t(64 * 64);
  DeviceBuffer<float> g(64 * 64), lse(64);
  CHECK_THROWS(frugal::cuda::attention_backward(g.get(), g.get(), g.get(), t.get(), t.get(),
                                                t.get(), t.get(), t.get(), lse.get(), s, nullptr,
                                                nullptr));
}
