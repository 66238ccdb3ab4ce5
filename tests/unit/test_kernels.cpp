// The CPU kernels against naive float64 references: every forward on random data of awkward
// sizes, every backward against central finite differences of the float64 reference forward.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/bias.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

namespace {

using namespace frugal::cpu;
using Vec = std::vector<double>;
using FVec = std::vector<float>;

constexpr double kForwardTol = 1e-5;   // fp32 kernel vs float64 reference, relative to max |ref|
constexpr double kGradientTol = 1e-4;  // fp32 backward vs float64 finite differences
constexpr double kStep = 1e-3;         // finite-difference step on the float64 reference

FVec random_floats(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  FVec x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

Vec to_double(const FVec& x) { return Vec(x.begin(), x.end()); }

// max |got - want| / max |want|: NaN anywhere makes it NaN, which fails every `err < tol`.
double rel_err(const FVec& got, const Vec& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::abs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(diff)) return diff;
    worst = std::max(worst, diff);
    scale = std::max(scale, std::abs(want[i]));
  }
  return worst / std::max(scale, 1e-30);
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of the scalar f at x, one coordinate at a time.
Vec numeric_grad(Vec x, const std::function<double(const Vec&)>& f, double h = kStep) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = f(x);
    x[i] = saved - h;
    const double down = f(x);
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// what() of the frugal::Error that fn throws, "" if it throws none.
std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const frugal::Error& e) {
    return e.what();
  }
  return "";
}

// ---- float64 references ---------------------------------------------------------------------

Vec linear_ref(const Vec& x, const Vec& w, int64_t m, int64_t n, int64_t k) {
  Vec y(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < n; ++o)
      for (int64_t c = 0; c < k; ++c) y[i * n + o] += x[i * k + c] * w[o * k + c];
  return y;
}

Vec embedding_ref(const std::vector<int32_t>& tokens, const Vec& table, int64_t dim) {
  Vec out;
  for (int32_t t : tokens)
    out.insert(out.end(), table.begin() + t * dim, table.begin() + (t + 1) * dim);
  return out;
}

Vec rmsnorm_ref(const Vec& x, const Vec& w, int64_t rows, int64_t dim, double eps, Vec* rstd) {
  Vec y(x.size());
  if (rstd) rstd->assign(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < dim; ++j) ms += x[r * dim + j] * x[r * dim + j];
    const double rs = 1.0 / std::sqrt(ms / dim + eps);
    for (int64_t j = 0; j < dim; ++j) y[r * dim + j] = x[r * dim + j] * rs * w[j];
    if (rstd) (*rstd)[r] = rs;
  }
  return y;
}

// hf_angles: the angle as Hugging Face rounds it (float inv_freq, float product); otherwise the
// exact pos * theta^(-2i/d) in double.
// float(1 / theta^(2i/d)): the plain rotary table.
FVec plain_inv_freq(double theta, int64_t d) {
  FVec inv(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i)
    inv[i] = static_cast<float>(1.0 / std::pow(theta, 2.0 * i / d));
  return inv;
}

Vec rope_ref(const Vec& x, const std::vector<int32_t>& pos, int64_t tokens, int64_t heads,
             int64_t d, double theta, bool hf_angles, double scaling = 1.0) {
  Vec y(x.size());
  const int64_t half = d / 2;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        double angle = pos[t] * std::pow(theta, -2.0 * i / d);
        if (hf_angles) {
          const float inv_freq = static_cast<float>(1.0 / std::pow(theta, 2.0 * i / d));
          angle = static_cast<float>(pos[t]) * inv_freq;
        }
        const int64_t base = (t * heads + h) * d;
        const double x1 = x[base + i], x2 = x[base + i + half];
        y[base + i] = scaling * (x1 * std::cos(angle) - x2 * std::sin(angle));
        y[base + i + half] = scaling * (x2 * std::cos(angle) + x1 * std::sin(angle));
      }
  return y;
}

Vec swiglu_ref(const Vec& g, const Vec& u) {
  Vec h(g.size());
  for (size_t i = 0; i < g.size(); ++i) h[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return h;
}

// Sum over counted rows of -log softmax(logits)[target].
double cross_entropy_ref(const Vec& logits, const std::vector<int32_t>& targets, int64_t vocab) {
  double total = 0;
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] < 0) continue;
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(logits[r * vocab + j]);
    total += std::log(sum) - logits[r * vocab + targets[r]];
  }
  return total;
}

struct AttentionRef {
  Vec out, lse;
};

AttentionRef attention_ref(const Vec& q, const Vec& k, const Vec& v, const AttentionShape& s) {
  const int64_t B = s.batch, Tq = s.q_len, Tk = s.kv_len, H = s.n_heads, G = s.n_kv_heads;
  const int64_t D = s.head_dim;
  AttentionRef r{Vec(B * Tq * H * D, 0.0), Vec(B * H * Tq, 0.0)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t g = h / (H / G);
        Vec score;
        // A sliding window hides the keys at distance >= window: j > (i + offset) - window.
        const int64_t j_first =
            s.window > 0 ? std::max<int64_t>(0, i + s.causal_offset - s.window + 1) : 0;
        int64_t j = j_first;
        for (; j < Tk && j <= i + s.causal_offset; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d)
            acc += q[((b * Tq + i) * H + h) * D + d] * k[((b * Tk + j) * G + g) * D + d];
          score.push_back(acc * static_cast<double>(s.scale));
        }
        if (score.empty()) {
          r.lse[(b * H + h) * Tq + i] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double max = *std::max_element(score.begin(), score.end()), sum = 0;
        for (double sc : score) sum += std::exp(sc - max);
        for (size_t n = 0; n < score.size(); ++n) {
          const double p = std::exp(score[n] - max) / sum;
          for (int64_t d = 0; d < D; ++d)
            r.out[((b * Tq + i) * H + h) * D + d] +=
                p * v[((b * Tk + j_first + static_cast<int64_t>(n)) * G + g) * D + d];
        }
        r.lse[(b * H + h) * Tq + i] = max + std::log(sum);
      }
  return r;
}

// Forward (out and lse, with -inf where a row sees nothing) and the backward against finite
// differences of sum(out * dout) for one shape.
void check_attention(const AttentionShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t nq = s.batch * s.q_len * s.n_heads * s.head_dim;
  const size_t nkv = s.batch * s.kv_len * s.n_kv_heads * s.head_dim;
  const FVec q = random_floats(nq, rng, -2, 2), k = random_floats(nkv, rng, -2, 2);
  const FVec v = random_floats(nkv, rng), dout = random_floats(nq, rng);
  const Vec qd = to_double(q), kd = to_double(k), vd = to_double(v), doutd = to_double(dout);

  FVec out(nq, 99.0f), lse(s.batch * s.n_heads * s.q_len, 99.0f);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  const AttentionRef ref = attention_ref(qd, kd, vd, s);
  CHECK(rel_err(out, ref.out) < kForwardTol);
  FVec lse_finite;
  Vec lse_ref_finite;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      CHECK((std::isinf(lse[i]) && lse[i] < 0));
    } else {
      lse_finite.push_back(lse[i]);
      lse_ref_finite.push_back(ref.lse[i]);
    }
  }
  CHECK(rel_err(lse_finite, lse_ref_finite) < kForwardTol);

  // dq, dk, dv are accumulated: start from a known offset and subtract it afterwards.
  const FVec dq0 = random_floats(nq, rng), dk0 = random_floats(nkv, rng);
  const FVec dv0 = random_floats(nkv, rng);
  FVec dq = dq0, dk = dk0, dv = dv0;
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                     out.data(), lse.data(), s);
  for (size_t i = 0; i < nq; ++i) dq[i] -= dq0[i];
  for (size_t i = 0; i < nkv; ++i) dk[i] -= dk0[i], dv[i] -= dv0[i];

  const Vec num_dq =
      numeric_grad(qd, [&](const Vec& x) { return dot(attention_ref(x, kd, vd, s).out, doutd); });
  const Vec num_dk =
      numeric_grad(kd, [&](const Vec& x) { return dot(attention_ref(qd, x, vd, s).out, doutd); });
  const Vec num_dv =
      numeric_grad(vd, [&](const Vec& x) { return dot(attention_ref(qd, kd, x, s).out, doutd); });
  CHECK(rel_err(dq, num_dq) < kGradientTol);
  CHECK(rel_err(dk, num_dk) < kGradientTol);
  CHECK(rel_err(dv, num_dv) < kGradientTol);

  // Rows that see no key: out 0 and no gradient, exactly.
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.q_len; ++i) {
      if (!std::isinf(ref.lse[(b * s.n_heads) * s.q_len + i])) continue;
      for (int64_t h = 0; h < s.n_heads; ++h)
        for (int64_t d = 0; d < s.head_dim; ++d) {
          const size_t at = ((b * s.q_len + i) * s.n_heads + h) * s.head_dim + d;
          CHECK(out[at] == 0.0f);
          CHECK(std::abs(dq[at]) < 1e-6f);  // dq0 + 0 - dq0, exact up to nothing
        }
    }
}

AttentionShape make_shape(int64_t batch, int64_t q_len, int64_t kv_len, int64_t heads,
                          int64_t kv_heads, int64_t head_dim, int64_t causal_offset,
                          int64_t window = 0) {
  AttentionShape s;
  s.batch = batch;
  s.q_len = q_len;
  s.kv_len = kv_len;
  s.n_heads = heads;
  s.n_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  s.causal_offset = causal_offset;
  s.window = window;
  return s;
}

}  // namespace

TEST_CASE("linear: forward and backward against float64", "[kernels]") {
  const int64_t m = 13, n = 11, k = 48;
  std::mt19937 rng(1);
  const FVec x = random_floats(m * k, rng), w = random_floats(n * k, rng);
  const FVec dy = random_floats(m * n, rng);
  const Vec xd = to_double(x), wd = to_double(w), dyd = to_double(dy);

  FVec y(m * n, 99.0f);
  linear_forward(y.data(), x.data(), w.data(), m, n, k);
  CHECK(rel_err(y, linear_ref(xd, wd, m, n, k)) < kForwardTol);

  const FVec dw0 = random_floats(n * k, rng);
  FVec dx(m * k, 99.0f), dw = dw0;
  linear_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), m, n, k);
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];  // dw accumulates
  const Vec num_dx =
      numeric_grad(xd, [&](const Vec& xx) { return dot(linear_ref(xx, wd, m, n, k), dyd); });
  const Vec num_dw =
      numeric_grad(wd, [&](const Vec& ww) { return dot(linear_ref(xd, ww, m, n, k), dyd); });
  CHECK(rel_err(dx, num_dx) < kGradientTol);
  CHECK(rel_err(dw, num_dw) < kGradientTol);

  SECTION("null dx or dw is skipped") {
    FVec dw_only = dw0;
    linear_backward(nullptr, dw_only.data(), dy.data(), x.data(), w.data(), m, n, k);
    for (size_t i = 0; i < dw_only.size(); ++i) dw_only[i] -= dw0[i];
    CHECK(rel_err(dw_only, num_dw) < kGradientTol);
    FVec dx_only(m * k, 99.0f);
    linear_backward(dx_only.data(), nullptr, dy.data(), x.data(), w.data(), m, n, k);
    CHECK(dx_only == dx);
  }
}

TEST_CASE("embedding: lookup, scatter-add backward, range checks", "[kernels]") {
  const int64_t vocab = 37, dim = 48;
  const std::vector<int32_t> tokens = {3, 0, 36, 3, 17, 3, 36, 5, 9, 0, 21, 3, 30};  // repeats
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::mt19937 rng(2);
  const FVec table = random_floats(vocab * dim, rng);
  const Vec tabled = to_double(table);

  FVec out(n * dim, 99.0f);
  embedding_forward(out.data(), tokens.data(), table.data(), n, vocab, dim);
  CHECK(rel_err(out, embedding_ref(tokens, tabled, dim)) == 0.0);

  const FVec dout = random_floats(n * dim, rng);
  const FVec dtable0 = random_floats(vocab * dim, rng);
  FVec dtable = dtable0;
  embedding_backward(dtable.data(), dout.data(), tokens.data(), n, vocab, dim);
  for (size_t i = 0; i < dtable.size(); ++i) dtable[i] -= dtable0[i];  // accumulated
  const Vec num = numeric_grad(
      tabled, [&](const Vec& t) { return dot(embedding_ref(tokens, t, dim), to_double(dout)); });
  CHECK(rel_err(dtable, num) < kGradientTol);

  for (int32_t bad : {37, -1}) {
    std::vector<int32_t> bad_tokens = tokens;
    bad_tokens[4] = bad;
    REQUIRE_THROWS_AS(embedding_forward(out.data(), bad_tokens.data(), table.data(), n, vocab, dim),
                      frugal::Error);
    const std::string msg = error_message(
        [&] { embedding_forward(out.data(), bad_tokens.data(), table.data(), n, vocab, dim); });
    CHECK(msg.find(std::to_string(bad)) != std::string::npos);
    CHECK(msg.find("37") != std::string::npos);
    REQUIRE_THROWS_AS(
        embedding_backward(dtable.data(), dout.data(), bad_tokens.data(), n, vocab, dim),
        frugal::Error);
  }
}

TEST_CASE("rmsnorm: forward and backward against float64", "[kernels]") {
  const int64_t rows = 13, dim = 48;
  const float eps = 1e-5f;
  std::mt19937 rng(3);
  FVec x = random_floats(rows * dim, rng, -2, 2);
  for (int64_t j = 0; j < dim; ++j) x[5 * dim + j] *= 1e-3f;  // a row where eps matters
  const FVec w = random_floats(dim, rng, 0.5f, 1.5f), dy = random_floats(rows * dim, rng);
  const Vec xd = to_double(x), wd = to_double(w), dyd = to_double(dy);

  FVec y(rows * dim, 99.0f), rstd(rows, 99.0f);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, eps);
  Vec rstd_ref;
  CHECK(rel_err(y, rmsnorm_ref(xd, wd, rows, dim, eps, &rstd_ref)) < kForwardTol);
  CHECK(rel_err(rstd, rstd_ref) < kForwardTol);
  FVec y_no_rstd(rows * dim);
  rmsnorm_forward(y_no_rstd.data(), nullptr, x.data(), w.data(), rows, dim, eps);
  CHECK(y_no_rstd == y);

  const FVec dw0 = random_floats(dim, rng);
  FVec dx(rows * dim, 99.0f), dw = dw0;
  rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, dim);
  for (int64_t j = 0; j < dim; ++j) dw[j] -= dw0[j];
  const Vec num_dx = numeric_grad(
      xd, [&](const Vec& xx) { return dot(rmsnorm_ref(xx, wd, rows, dim, eps, nullptr), dyd); });
  const Vec num_dw = numeric_grad(
      wd, [&](const Vec& ww) { return dot(rmsnorm_ref(xd, ww, rows, dim, eps, nullptr), dyd); });
  // The 1e-3 row's inputs are below the step, so take its FD with a proportionate step.
  const Vec num_dx_small = numeric_grad(
      xd, [&](const Vec& xx) { return dot(rmsnorm_ref(xx, wd, rows, dim, eps, nullptr), dyd); },
      1e-7);
  Vec num_dx_mixed = num_dx;
  std::copy(num_dx_small.begin() + 5 * dim, num_dx_small.begin() + 6 * dim,
            num_dx_mixed.begin() + 5 * dim);
  CHECK(rel_err(dx, num_dx_mixed) < kGradientTol);
  CHECK(rel_err(dw, num_dw) < kGradientTol);
}

TEST_CASE("rope: Hugging Face rotate-half, backward is the inverse", "[kernels]") {
  const int64_t tokens = 13, heads = 3, d = 16;
  std::mt19937 rng(4);
  const FVec x = random_floats(tokens * heads * d, rng);
  const Vec xd = to_double(x);

  SECTION("small positions: the exact angles pos * theta^(-2i/d)") {
    std::vector<int32_t> pos(tokens);
    for (int64_t t = 0; t < tokens; ++t) pos[t] = static_cast<int32_t>((t * 7) % 40);
    FVec y = x;
    rope_forward(y.data(), pos.data(), tokens, heads, d, plain_inv_freq(10000.0, d).data(), 1.0f);
    CHECK(rel_err(y, rope_ref(xd, pos, tokens, heads, d, 10000.0, false)) < 2 * kForwardTol);
  }

  SECTION("a scaled table: cos and sin times the attention scaling, backward its adjoint") {
    // Linear scaling by 4 is the plain table of theta over 4 positions per step; YaRN's
    // attention factor multiplies the rotation.
    const std::vector<int32_t> pos = {0, 1, 2, 3, 12, 511, 4095, 8191, 32767, 131071, 5, 6, 0};
    FVec inv = plain_inv_freq(10000.0, d);
    for (float& f : inv) f /= 4.0f;
    const double scaling = 1.1386294361119891;  // 0.1 ln 4 + 1
    FVec y = x;
    rope_forward(y.data(), pos.data(), tokens, heads, d, inv.data(), static_cast<float>(scaling));
    Vec want(xd.size());
    {
      const int64_t half = d / 2;
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<float>(pos[t]) * inv[i];
            const int64_t b = (t * heads + h) * d;
            want[b + i] =
                scaling * (xd[b + i] * std::cos(angle) - xd[b + i + half] * std::sin(angle));
            want[b + i + half] =
                scaling * (xd[b + i + half] * std::cos(angle) + xd[b + i] * std::sin(angle));
          }
    }
    CHECK(rel_err(y, want) < kForwardTol);
    const FVec dy = random_floats(tokens * heads * d, rng);
    FVec dx = dy;
    rope_backward(dx.data(), pos.data(), tokens, heads, d, inv.data(), static_cast<float>(scaling));
    // <rope(x), dy> = <x, rope_backward(dy)>: the backward is the adjoint.
    FVec ry = x;
    rope_forward(ry.data(), pos.data(), tokens, heads, d, inv.data(), static_cast<float>(scaling));
    double lhs = 0, rhs = 0;
    for (size_t j = 0; j < x.size(); ++j) {
      lhs += double(ry[j]) * dy[j];
      rhs += double(x[j]) * dx[j];
    }
    CHECK(std::fabs(lhs - rhs) < 1e-5 * (std::fabs(lhs) + 1));
  }

  for (double theta : {10000.0, 500000.0}) {
    // Large positions too: the angle is rounded as Hugging Face rounds it.
    const std::vector<int32_t> pos = {0, 1, 2, 3, 12, 511, 4095, 8191, 32767, 131071, 5, 6, 0};
    FVec y = x;
    const FVec inv = plain_inv_freq(theta, d);
    rope_forward(y.data(), pos.data(), tokens, heads, d, inv.data(), 1.0f);
    CHECK(rel_err(y, rope_ref(xd, pos, tokens, heads, d, theta, true)) < kForwardTol);
    // Position 0 is the identity.
    for (int64_t j = 0; j < heads * d; ++j) CHECK(y[j] == x[j]);

    const FVec dy = random_floats(tokens * heads * d, rng);
    FVec dx = dy;
    rope_backward(dx.data(), pos.data(), tokens, heads, d, inv.data(), 1.0f);
    const Vec num = numeric_grad(xd, [&](const Vec& xx) {
      return dot(rope_ref(xx, pos, tokens, heads, d, theta, true), to_double(dy));
    });
    CHECK(rel_err(dx, num) < kGradientTol);

    rope_backward(y.data(), pos.data(), tokens, heads, d, inv.data(), 1.0f);
    CHECK(rel_err(y, xd) < kForwardTol);  // forward then backward is the identity
  }
}

TEST_CASE("bias: added to every row, gradient the sum of the rows, against float64", "[kernels]") {
  const int64_t rows = 37, cols = 13;
  std::mt19937 rng(8);
  const FVec x = random_floats(rows * cols, rng), b = random_floats(cols, rng);
  const FVec dy = random_floats(rows * cols, rng);
  FVec y = x;
  add_bias(y.data(), b.data(), rows, cols);
  FVec db(static_cast<size_t>(cols), 0.5f);  // accumulated into
  bias_backward(db.data(), dy.data(), rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      CHECK(y[r * cols + c] == Approx(double(x[r * cols + c]) + b[c]).epsilon(1e-6));
  for (int64_t c = 0; c < cols; ++c) {
    double sum = 0.5;
    for (int64_t r = 0; r < rows; ++r) sum += dy[r * cols + c];
    CHECK(db[c] == Approx(sum).epsilon(1e-6));
  }
}

TEST_CASE("swiglu: forward and backward against float64", "[kernels]") {
  const int64_t n = 13 * 37;
  std::mt19937 rng(5);
  FVec g = random_floats(n, rng, -6, 6);
  g[0] = -100.0f, g[1] = 100.0f, g[2] = 0.0f, g[3] = -20.0f;  // saturated and zero
  const FVec u = random_floats(n, rng, -2, 2), dh = random_floats(n, rng);
  const Vec gd = to_double(g), ud = to_double(u), dhd = to_double(dh);

  FVec h(n, 99.0f);
  swiglu_forward(h.data(), g.data(), u.data(), n);
  CHECK(rel_err(h, swiglu_ref(gd, ud)) < kForwardTol);

  FVec dg(n, 99.0f), du(n, 99.0f);
  swiglu_backward(dg.data(), du.data(), dh.data(), g.data(), u.data(), n);
  const Vec num_dg = numeric_grad(gd, [&](const Vec& gg) { return dot(swiglu_ref(gg, ud), dhd); });
  const Vec num_du = numeric_grad(ud, [&](const Vec& uu) { return dot(swiglu_ref(gd, uu), dhd); });
  CHECK(rel_err(dg, num_dg) < kGradientTol);
  CHECK(rel_err(du, num_du) < kGradientTol);
}

TEST_CASE("cross_entropy: masked sum, gradient, range check", "[kernels]") {
  const int64_t rows = 13, vocab = 37;
  std::mt19937 rng(6);
  FVec logits = random_floats(rows * vocab, rng, -4, 4);
  for (int64_t j = 0; j < vocab; ++j) logits[2 * vocab + j] *= 30.0f;  // |logit| up to 120
  std::vector<int32_t> targets = {0, 36, 5, -100, 17, 17, -1, 3, 22, 9, -100, 30, 1};
  const Vec logitsd = to_double(logits);
  const int counted = 10;
  const float grad_scale = 1.0f / counted;

  FVec dlogits(rows * vocab, 99.0f);
  const double loss =
      cross_entropy(dlogits.data(), logits.data(), targets.data(), rows, vocab, grad_scale);
  const double loss_ref = cross_entropy_ref(logitsd, targets, vocab);
  CHECK(std::abs(loss - loss_ref) < 1e-9 * std::abs(loss_ref));
  CHECK(cross_entropy(nullptr, logits.data(), targets.data(), rows, vocab, grad_scale) == loss);

  const Vec num = numeric_grad(
      logitsd, [&](const Vec& l) { return grad_scale * cross_entropy_ref(l, targets, vocab); });
  CHECK(rel_err(dlogits, num) < kGradientTol);
  for (int64_t r : {3, 6, 10})  // masked rows: gradient exactly 0
    for (int64_t j = 0; j < vocab; ++j) CHECK(dlogits[r * vocab + j] == 0.0f);

  SECTION("all rows masked: zero loss") {
    std::vector<int32_t> none(rows, -100);
    CHECK(cross_entropy(dlogits.data(), logits.data(), none.data(), rows, vocab, 1.0f) == 0.0);
  }
  SECTION("a target outside the vocabulary throws") {
    targets[7] = 37;
    REQUIRE_THROWS_AS(
        cross_entropy(dlogits.data(), logits.data(), targets.data(), rows, vocab, grad_scale),
        frugal::Error);
    const std::string msg = error_message(
        [&] { cross_entropy(nullptr, logits.data(), targets.data(), rows, vocab, grad_scale); });
    CHECK(msg.find("37") != std::string::npos);
  }
}

TEST_CASE("adamw: three steps against torch's formula in float64", "[kernels]") {
  const int64_t n = 103;
  std::mt19937 rng(7);
  const FVec param0 = random_floats(n, rng);
  AdamWStep s;
  s.lr = 1e-2f;
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.grad_scale = 0.5f;

  FVec p = param0, m(n, 0.0f), v(n, 0.0f);
  Vec pd = to_double(param0), md(n, 0.0), vd(n, 0.0);
  for (int64_t step = 1; step <= 3; ++step) {
    FVec grad = random_floats(n, rng, -3, 3);
    grad[0] = 0.0f;  // v stays 0 there: the update divides by eps
    s.step = step;
    adamw_update(p.data(), grad.data(), m.data(), v.data(), n, s);
    // torch.optim.AdamW, written out in float64.
    const double lr = s.lr, b1 = s.beta1, b2 = s.beta2, eps = s.eps, wd = s.weight_decay;
    for (int64_t i = 0; i < n; ++i) {
      const double g = static_cast<double>(grad[i]) * s.grad_scale;
      pd[i] *= 1 - lr * wd;
      md[i] = b1 * md[i] + (1 - b1) * g;
      vd[i] = b2 * vd[i] + (1 - b2) * g * g;
      const double m_hat = md[i] / (1 - std::pow(b1, step));
      const double v_hat = vd[i] / (1 - std::pow(b2, step));
      pd[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
  CHECK(rel_err(m, md) < kForwardTol);
  CHECK(rel_err(v, vd) < kForwardTol);
  // The update itself (param - param0), not just the parameters that hardly moved.
  FVec delta(n);
  Vec delta_ref(n);
  for (int64_t i = 0; i < n; ++i) {
    delta[i] = p[i] - param0[i];
    delta_ref[i] = pd[i] - param0[i];
  }
  CHECK(rel_err(delta, delta_ref) < 1e-4);
  CHECK(rel_err(p, pd) < kForwardTol);

  // The bf16 copy written in the same pass is the updated weight rounded to nearest even, and
  // the fp32 results are those of the pass without it.
  FVec p2 = p, m2 = m, v2 = v, p3 = p, m3 = m, v3 = v;
  const FVec grad = random_floats(n, rng, -3, 3);
  s.step = 4;
  std::vector<uint16_t> copy(n, 0xFFFF);
  adamw_update(p2.data(), grad.data(), m2.data(), v2.data(), n, s, copy.data());
  adamw_update(p3.data(), grad.data(), m3.data(), v3.data(), n, s);
  CHECK(p2 == p3);
  CHECK(m2 == m3);
  CHECK(v2 == v3);
  size_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) mismatches += copy[i] != frugal::float_to_bf16(p3[i]);
  CHECK(mismatches == 0);

  SECTION("the vectorized loop computes the bits of the formula in fp32") {
    // Long enough for several blocks over the threads and the widest vectors the CPU has
    // (the loop is compiled for AVX2 and AVX-512 too): each element as the header writes it,
    // one fp32 operation at a time (-ffp-contract=off: no fused multiply-adds, here or there).
    const int64_t big = 100003;
    FVec pb = random_floats(big, rng), mb = random_floats(big, rng, 0, 1), vb(big),
         gb = random_floats(big, rng, -3, 3);
    for (float& e : vb) e = std::abs(random_floats(1, rng)[0]);
    FVec pr = pb, mr = mb, vr = vb;
    std::vector<uint16_t> copy_b(big);
    s.step = 5;
    adamw_update(pb.data(), gb.data(), mb.data(), vb.data(), big, s, copy_b.data());
    const double lr = s.lr, b1 = s.beta1, b2 = s.beta2;
    const float decay = static_cast<float>(1.0 - lr * double(s.weight_decay));
    const float step_size = static_cast<float>(lr / (1.0 - std::pow(b1, 5.0)));
    const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, 5.0)));
    const float omb1 = static_cast<float>(1.0 - b1), omb2 = static_cast<float>(1.0 - b2);
    size_t differ = 0;
    for (int64_t i = 0; i < big; ++i) {
      const float g = gb[i] * s.grad_scale;
      float p_i = pr[i] * decay;
      const float m_i = mr[i] + omb1 * (g - mr[i]);
      const float v_i = vr[i] * s.beta2 + omb2 * g * g;
      const float denom = std::sqrt(v_i) / bc2_sqrt + s.eps;
      p_i -= step_size * (m_i / denom);
      differ += std::bit_cast<uint32_t>(p_i) != std::bit_cast<uint32_t>(pb[i]) ||
                std::bit_cast<uint32_t>(m_i) != std::bit_cast<uint32_t>(mb[i]) ||
                std::bit_cast<uint32_t>(v_i) != std::bit_cast<uint32_t>(vb[i]) ||
                frugal::float_to_bf16(p_i) != copy_b[i];
    }
    CHECK(differ == 0);
  }

  SECTION("sum_squares over several chunks") {
    const FVec x = random_floats(100003, rng);
    double ref = 0;
    for (float e : x) ref += static_cast<double>(e) * e;
    CHECK(std::abs(sum_squares(x.data(), static_cast<int64_t>(x.size())) - ref) < 1e-12 * ref);
    CHECK(sum_squares(x.data(), 0) == 0.0);
  }
}

TEST_CASE("elementwise helpers", "[kernels]") {
  const int64_t n = 1001;
  std::mt19937 rng(8);
  const FVec x = random_floats(n, rng), y0 = random_floats(n, rng);
  FVec a = y0, b = y0, c = y0;
  add_inplace(a.data(), x.data(), n);
  scale_inplace(b.data(), -0.37f, n);
  add_scaled_inplace(c.data(), x.data(), 2.5f, n);
  Vec ra(n), rb(n), rc(n);
  for (int64_t i = 0; i < n; ++i) {
    ra[i] = static_cast<double>(y0[i]) + x[i];
    rb[i] = static_cast<double>(y0[i]) * -0.37f;
    rc[i] = static_cast<double>(y0[i]) + 2.5 * x[i];
  }
  CHECK(rel_err(a, ra) < kForwardTol);
  CHECK(rel_err(b, rb) < kForwardTol);
  CHECK(rel_err(c, rc) < kForwardTol);
}

TEST_CASE("attention: causal GQA forward and backward against float64", "[kernels]") {
  SECTION("3 heads share 1 kv head") { check_attention(make_shape(2, 13, 13, 3, 1, 16, 0), 11); }
  SECTION("4 heads, 2 kv heads") { check_attention(make_shape(2, 13, 13, 4, 2, 16, 0), 12); }
  SECTION("multi-head, head_dim 24") { check_attention(make_shape(1, 7, 7, 2, 2, 24, 0), 13); }
  SECTION("q_len 5, kv_len 9, offset 4: the last row sees every key") {
    check_attention(make_shape(2, 5, 9, 4, 2, 16, 4), 14);
  }
  SECTION("q_len 5, kv_len 9, offset -2: rows 0 and 1 see nothing") {
    check_attention(make_shape(2, 5, 9, 3, 1, 16, -2), 15);
  }
  SECTION("keys beyond kv_len: offset 20 sees all 9 keys from row 0") {
    check_attention(make_shape(1, 5, 9, 2, 1, 16, 20), 16);
  }
  SECTION("more than one key block of the backward (kv_len 150)") {
    check_attention(make_shape(1, 3, 150, 2, 1, 8, 140), 17);
  }
}

TEST_CASE("attention: sliding window forward and backward against float64", "[kernels]") {
  // Row i sees keys j with i - W < j <= i (transformers' sliding_window_overlay).
  SECTION("window 5 of 13, GQA") { check_attention(make_shape(2, 13, 13, 4, 2, 16, 0, 5), 41); }
  SECTION("window 2: each row sees itself and the key before") {
    check_attention(make_shape(1, 7, 7, 3, 1, 16, 0, 2), 42);
  }
  SECTION("window 1: each row sees itself only, out = v, no gradient reaches q and k") {
    const AttentionShape s = make_shape(1, 6, 6, 2, 1, 8, 0, 1);
    std::mt19937 rng(48);
    const FVec q = random_floats(6 * 2 * 8, rng), k = random_floats(6 * 8, rng);
    const FVec v = random_floats(6 * 8, rng), dout = random_floats(6 * 2 * 8, rng);
    FVec out(q.size()), lse(2 * 6), dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                       out.data(), lse.data(), s);
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t d = 0; d < 8; ++d) {
        CHECK(out[(i * 2 + 0) * 8 + d] == v[i * 8 + d]);
        CHECK(out[(i * 2 + 1) * 8 + d] == v[i * 8 + d]);
        // dv of key i is the sum of dout over the two heads of its row.
        CHECK(std::abs(dv[i * 8 + d] - (dout[(i * 2) * 8 + d] + dout[(i * 2 + 1) * 8 + d])) <
              1e-6f);
        CHECK(std::abs(dq[(i * 2) * 8 + d]) < 1e-6f);
        CHECK(std::abs(dk[i * 8 + d]) < 1e-6f);
      }
  }
  SECTION("window longer than the sequence: plain causal") {
    check_attention(make_shape(2, 9, 9, 2, 2, 8, 0, 50), 43);
  }
  SECTION("cache step: q_len 4 after 9 cached keys, window 6") {
    check_attention(make_shape(2, 4, 13, 4, 2, 16, 9, 6), 44);
  }
  SECTION("a block far behind: offset 12, window 10, only the last keys are seen") {
    check_attention(make_shape(1, 5, 9, 2, 1, 16, 12, 10), 45);
  }
  SECTION("a block wholly outside the window: every row sees nothing") {
    check_attention(make_shape(1, 4, 6, 2, 1, 8, 20, 10), 46);
  }
  SECTION("two key blocks of the backward (kv_len 100), window 70") {
    check_attention(make_shape(1, 100, 100, 2, 1, 4, 0, 70), 47);
  }
}

// Ring attention: attend to key blocks one at a time, merge the outputs with their LSEs, and
// run each block's backward with the merged out and lse into shared dq and per-block dk, dv.
TEST_CASE("attention: blocks merged by LSE equal attention over the concatenation", "[kernels]") {
  const int64_t B = 2, Tq = 5, Tk = 9, H = 4, G = 2, D = 16, split = 4;
  for (int64_t offset : {4, 0}) {  // with offset 0, rows 0..3 see nothing of the second block
    const AttentionShape full = make_shape(B, Tq, Tk, H, G, D, offset);
    AttentionShape first = make_shape(B, Tq, split, H, G, D, offset);
    // The second block's key j is the full key split + j: visible iff split + j <= i + offset.
    AttentionShape second = make_shape(B, Tq, Tk - split, H, G, D, offset - split);

    std::mt19937 rng(20 + static_cast<uint32_t>(offset));
    const FVec q = random_floats(B * Tq * H * D, rng, -2, 2);
    const FVec k = random_floats(B * Tk * G * D, rng, -2, 2),
               v = random_floats(B * Tk * G * D, rng);
    const FVec dout = random_floats(B * Tq * H * D, rng);
    // Split k and v along the sequence: [B, Tk, G, D] -> [B, split, G, D] and the rest.
    auto slice = [&](const FVec& x, int64_t j0, int64_t j1) {
      FVec part;
      for (int64_t b = 0; b < B; ++b)
        part.insert(part.end(), x.begin() + (b * Tk + j0) * G * D,
                    x.begin() + (b * Tk + j1) * G * D);
      return part;
    };
    const FVec k1 = slice(k, 0, split), v1 = slice(v, 0, split);
    const FVec k2 = slice(k, split, Tk), v2 = slice(v, split, Tk);

    FVec out(B * Tq * H * D), lse(B * H * Tq);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), full);
    FVec out1(out.size()), lse1(lse.size()), out2(out.size()), lse2(lse.size());
    attention_forward(out1.data(), lse1.data(), q.data(), k1.data(), v1.data(), first);
    attention_forward(out2.data(), lse2.data(), q.data(), k2.data(), v2.data(), second);

    FVec merged(out.size()), merged_lse(lse.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Tq; ++i) {
          const int64_t r = (b * H + h) * Tq + i;
          const double l1 = lse1[r], l2 = lse2[r];
          const double l = std::max(l1, l2) + std::log1p(std::exp(-std::abs(l1 - l2)));
          merged_lse[r] = static_cast<float>(l);
          for (int64_t d = 0; d < D; ++d) {
            const int64_t at = ((b * Tq + i) * H + h) * D + d;
            merged[at] =
                static_cast<float>(std::exp(l1 - l) * out1[at] + std::exp(l2 - l) * out2[at]);
          }
        }
    CHECK(rel_err(merged, to_double(out)) < kForwardTol);
    CHECK(rel_err(merged_lse, to_double(lse)) < kForwardTol);

    FVec dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                       out.data(), lse.data(), full);
    FVec dq_ring(q.size(), 0.0f), dk1(k1.size(), 0.0f), dv1(v1.size(), 0.0f);
    FVec dk2(k2.size(), 0.0f), dv2(v2.size(), 0.0f);
    attention_backward(dq_ring.data(), dk1.data(), dv1.data(), dout.data(), q.data(), k1.data(),
                       v1.data(), out.data(), lse.data(), first);
    attention_backward(dq_ring.data(), dk2.data(), dv2.data(), dout.data(), q.data(), k2.data(),
                       v2.data(), out.data(), lse.data(), second);
    CHECK(rel_err(dq_ring, to_double(dq)) < kForwardTol);
    CHECK(rel_err(dk1, to_double(slice(dk, 0, split))) < kForwardTol);
    CHECK(rel_err(dv1, to_double(slice(dv, 0, split))) < kForwardTol);
    CHECK(rel_err(dk2, to_double(slice(dk, split, Tk))) < kForwardTol);
    CHECK(rel_err(dv2, to_double(slice(dv, split, Tk))) < kForwardTol);
  }
}

// Every reduction runs in a fixed order, so one thread and several give the same bits.
TEST_CASE("kernels: results do not depend on the thread count", "[kernels]") {
  std::mt19937 rng(30);
  const int64_t rows = 301, dim = 97, vocab = 97;  // above the kernels' parallel thresholds
  const FVec x = random_floats(rows * dim, rng), w = random_floats(dim, rng);
  const FVec dy = random_floats(rows * dim, rng);
  std::vector<int32_t> tokens(rows);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 7);  // many repeats
  std::vector<int32_t> targets(rows);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % (vocab + 1)) - 1;  // some masked
  const AttentionShape s = make_shape(2, 70, 70, 4, 2, 16, 0);
  const size_t nq = 2 * 70 * 4 * 16, nkv = 2 * 70 * 2 * 16;
  const FVec q = random_floats(nq, rng), k = random_floats(nkv, rng), v = random_floats(nkv, rng);
  const FVec dout = random_floats(nq, rng);
  const FVec big = random_floats(100003, rng);

  struct Results {
    std::vector<FVec> arrays;
    double loss = 0, norm = 0;
  };
  auto run_all = [&](int threads) {
    omp_set_num_threads(threads);
    FVec y(rows * dim), rstd(rows), dx(rows * dim), dw(dim, 0.0f), dtable(7 * dim, 0.0f);
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5f);
    rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, dim);
    embedding_backward(dtable.data(), dy.data(), tokens.data(), rows, 7, dim);
    FVec dlogits(rows * vocab);
    const double loss =
        cross_entropy(dlogits.data(), x.data(), targets.data(), rows, vocab, 1.0f / rows);
    FVec out(nq), lse(2 * 4 * 70), dq(nq, 0.0f), dk(nkv, 0.0f), dv(nkv, 0.0f);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                       out.data(), lse.data(), s);
    const double norm = sum_squares(big.data(), static_cast<int64_t>(big.size()));
    return Results{{y, rstd, dx, dw, dtable, dlogits, out, lse, dq, dk, dv}, loss, norm};
  };
  const int saved = omp_get_max_threads();
  const Results one = run_all(1);
  const Results three = run_all(3);
  omp_set_num_threads(saved);
  for (size_t i = 0; i < one.arrays.size(); ++i) {
    INFO("result " << i << " of y, rstd, dx, dw, dtable, dlogits, out, lse, dq, dk, dv");
    CHECK(one.arrays[i] == three.arrays[i]);
  }
  CHECK(one.loss == three.loss);
  CHECK(one.norm == three.norm);
}
