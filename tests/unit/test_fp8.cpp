// FP8 casts with a scale (kernels/cpu/fp8.h) against independent references: every code of
// E4M3 and E5M2 decoded by the float64 formula of the OCP FP8 tables and round-tripped; random
// data (with subnormals and saturation) against a float64 nearest-even search over the codes;
// the amax, the transposed copy and the flush/saturation counts recounted in float64; and the
// delayed-scaling update (history roll, margin, a zero or non-finite amax keeps the scale).
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "catch_compat.h"
#include "core/random.h"
#include "kernels/cpu/fp8.h"

using namespace frugal;
using cpu::Fp8Format;

namespace {

// The OCP FP8 formula: (-1)^s 2^(e - bias) (1 + m / 2^mbits), subnormal 2^(1 - bias) m / 2^mbits.
// E4M3 ("fn"): bias 7, 3 mantissa bits, S.1111.111 is NaN and there is no infinity.
// E5M2: bias 15, 2 mantissa bits, exponent 11111 is inf (m = 0) or NaN.
double reference_decode(uint8_t code, Fp8Format f) {
  const bool e4m3 = f == Fp8Format::e4m3;
  const int mbits = e4m3 ? 3 : 2, ebits = e4m3 ? 4 : 5, bias = e4m3 ? 7 : 15;
  const int sign = code >> 7;
  const int e = (code >> mbits) & ((1 << ebits) - 1);
  const int m = code & ((1 << mbits) - 1);
  const double s = sign ? -1.0 : 1.0;
  if (e4m3 && e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (!e4m3 && e == 31)
    return m == 0 ? s * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return s * std::ldexp(double(m), 1 - bias - mbits);
  return s * std::ldexp(1.0 + double(m) / (1 << mbits), e - bias);
}

bool is_nan_code(uint8_t code, Fp8Format f) { return std::isnan(reference_decode(code, f)); }

// Nearest-even by brute force over the finite codes, in float64; past max, saturate.
uint8_t reference_encode(double v, Fp8Format f) {
  const double max_value = cpu::fp8_max(f);
  if (std::isnan(v)) return std::signbit(v) ? 0xFF : 0x7F;
  const bool negative = std::signbit(v);
  const double a = std::fabs(v);
  uint8_t best = 0;
  double best_err = INFINITY;
  for (int c = 0; c < 128; ++c) {
    const double d = reference_decode(uint8_t(c), f);
    if (!std::isfinite(d)) continue;
    const double err = std::fabs(d - std::min(a, max_value));
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = uint8_t(c);
      best_err = err;
    }
  }
  return uint8_t(best | (negative ? 0x80 : 0));
}

// Values spread over many binades: normal, subnormal (for the scale used), past max, zeros.
std::vector<float> spread_values(int64_t n, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    const double u = uniform01(seed);
    const double mag = std::ldexp(1.0 + uniform01(seed), int(uniform01(seed) * 52) - 34);
    v = float(u < 0.5 ? mag : -mag);
    if (u > 0.97) v = 0.0f;
  }
  return x;
}

}  // namespace

TEST_CASE("fp8 codes decode as the OCP tables say and round-trip", "[fp8]") {
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    int nan_codes = 0, inf_codes = 0;
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = uint8_t(c);
      const double want = reference_decode(code, f);
      const float got = cpu::fp8_decode(code, f);
      if (std::isnan(want)) {
        ++nan_codes;
        CHECK(std::isnan(got));
        // NaN encodes to a NaN code of the same sign.
        const uint8_t back = cpu::fp8_encode(got, f);
        CHECK(is_nan_code(back, f));
        continue;
      }
      if (std::isinf(want)) {
        ++inf_codes;
        CHECK(got == float(want));
        // Saturating: infinity becomes the largest finite value.
        CHECK(double(cpu::fp8_decode(cpu::fp8_encode(got, f), f)) ==
              std::copysign(double(cpu::fp8_max(f)), want));
        continue;
      }
      CHECK(double(got) == want);
      // decode -> encode is the identity, through the scaled cast with scale 1 as well.
      CHECK(cpu::fp8_encode(got, f) == code);
      uint8_t through_cast = 0;
      cpu::fp8_cast_transpose(&got, 1, 1, 1.0f, f, &through_cast, nullptr, nullptr);
      CHECK(through_cast == code);
    }
    CHECK(nan_codes == (f == Fp8Format::e4m3 ? 2 : 6));
    CHECK(inf_codes == (f == Fp8Format::e4m3 ? 0 : 2));
  }
  // Published constants: max, smallest subnormal.
  CHECK(cpu::fp8_max(Fp8Format::e4m3) == 448.0f);
  CHECK(cpu::fp8_max(Fp8Format::e5m2) == 57344.0f);
  CHECK(cpu::fp8_decode(0x7E, Fp8Format::e4m3) == 448.0f);
  CHECK(cpu::fp8_decode(0x01, Fp8Format::e4m3) == std::ldexp(1.0f, -9));
  CHECK(cpu::fp8_decode(0x7B, Fp8Format::e5m2) == 57344.0f);
  CHECK(cpu::fp8_decode(0x01, Fp8Format::e5m2) == std::ldexp(1.0f, -16));
}

TEST_CASE("fp8 scaled cast rounds to nearest even and saturates like a float64 search", "[fp8]") {
  const int64_t rows = 37, cols = 53;  // not powers of two
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (float scale : {1.0f, 0.75f, 3.0f * 1024.0f}) {
      const std::vector<float> x = spread_values(rows * cols, 7 + uint64_t(scale));
      std::vector<uint8_t> out(x.size()), out_t(x.size());
      cpu::Fp8CastCounts counts;
      counts.values = 5;  // counts add up
      const float amax = cpu::fp8_cast_transpose(x.data(), rows, cols, scale, f, out.data(),
                                                 out_t.data(), &counts);
      double want_amax = 0;
      int64_t flushed = 0, saturated = 0, subnormal = 0, mismatches = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float v = x[size_t(r * cols + c)];
          want_amax = std::max(want_amax, std::fabs(double(v)));
          // The kernel multiplies in float: the product, rounded once to float.
          const double scaled = double(float(double(v) * double(scale)));
          const uint8_t want = reference_encode(scaled, f);
          mismatches += out[size_t(r * cols + c)] != want;
          mismatches += out_t[size_t(c * rows + r)] != want;
          flushed += v != 0.0f && (want & 0x7F) == 0;
          saturated += std::fabs(scaled) > cpu::fp8_max(f);
          subnormal += (want & 0x7F) != 0 && ((want >> (f == Fp8Format::e4m3 ? 3 : 2)) &
                                              (f == Fp8Format::e4m3 ? 0xF : 0x1F)) == 0;
        }
      CHECK(mismatches == 0);
      CHECK(double(amax) == want_amax);
      CHECK(counts.values == 5 + rows * cols);
      CHECK(counts.flushed == flushed);
      CHECK(counts.saturated == saturated);
      // The data exercises what it should: subnormal codes, flushes and saturation.
      CHECK(subnormal > 0);
      CHECK(flushed > 0);
      CHECK(saturated > 0);
    }
  }
}

TEST_CASE("fp8 amax propagates NaN and dequantize inverts the scale", "[fp8]") {
  std::vector<float> x = {1.0f, -7.5f, 3.0f};
  CHECK(cpu::fp8_amax(x.data(), 3) == 7.5f);
  x[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(cpu::fp8_amax(x.data(), 3)));
  const std::vector<uint8_t> codes = {0x38, 0xB8, 0x7E};  // E4M3: 1, -1, 448
  std::vector<float> out(3);
  cpu::fp8_dequantize(out.data(), codes.data(), 3, Fp8Format::e4m3, 0.25f);
  CHECK(out == std::vector<float>{0.25f, -0.25f, 112.0f});
}

TEST_CASE("fp8 scale from amax: max * 2^-margin / amax, kept when amax says nothing", "[fp8]") {
  CHECK(cpu::fp8_scale_from_amax(2.0f, 1.0f, 448.0f, 0) == 224.0f);
  CHECK(cpu::fp8_scale_from_amax(2.0f, 1.0f, 448.0f, 2) == 56.0f);
  CHECK(cpu::fp8_scale_from_amax(0.0f, 3.0f, 448.0f, 0) == 3.0f);
  CHECK(cpu::fp8_scale_from_amax(INFINITY, 3.0f, 448.0f, 0) == 3.0f);
  CHECK(cpu::fp8_scale_from_amax(NAN, 3.0f, 448.0f, 0) == 3.0f);
  CHECK(cpu::fp8_scale_from_amax(1e-44f, 3.0f, 57344.0f, 0) == FLT_MAX);
}

TEST_CASE("fp8 delayed scaling: the history rolls and the scale follows its max", "[fp8]") {
  // Two slots (E4M3, E5M2), history of 3; feed amaxes step by step, compare with a model of
  // the recipe written out here: scale from the max of the last 3 amaxes.
  const int64_t len = 3, slots = 2;
  std::vector<float> history(len * slots, 0.0f), scale = {1.0f, 1.0f}, scale_inv(2);
  const std::vector<float> max_values = {448.0f, 57344.0f};
  const std::vector<std::vector<float>> steps = {{4.0f, 8.0f},  {1.0f, 2.0f},    {0.5f, NAN},
                                                 {0.25f, 1.0f}, {0.0f, 1.0f},    {0.0f, 1.0f},
                                                 {0.0f, 1.0f},  {INFINITY, 0.5f}};
  std::vector<std::vector<float>> seen(slots);
  for (size_t t = 0; t < steps.size(); ++t) {
    for (int64_t s = 0; s < slots; ++s) history[size_t(s)] = steps[t][size_t(s)];
    const std::vector<float> before = scale;
    cpu::fp8_delayed_update(history.data(), scale.data(), scale_inv.data(), max_values.data(), len,
                            slots, 1);
    for (int64_t s = 0; s < slots; ++s) {
      seen[size_t(s)].push_back(steps[t][size_t(s)]);
      // The window: this step and the two before.
      bool any_nan = false;
      double amax = 0;
      for (size_t i = seen[size_t(s)].size() >= 3 ? seen[size_t(s)].size() - 3 : 0;
           i < seen[size_t(s)].size(); ++i) {
        any_nan |= std::isnan(seen[size_t(s)][i]);
        amax = std::max(amax, double(seen[size_t(s)][i]));
      }
      const bool keep = any_nan || amax == 0 || std::isinf(amax);
      const double want = keep ? double(before[size_t(s)]) : max_values[size_t(s)] / 2.0 / amax;
      INFO("step " << t << " slot " << s);
      CHECK(double(scale[size_t(s)]) == want);
      CHECK(scale_inv[size_t(s)] == 1.0f / scale[size_t(s)]);
      CHECK(history[size_t(s)] == 0.0f);  // row 0 cleared for the next step
    }
  }
  // Spot checks: the first step's scale is 448 / 2 / 4; by step 6 slot 0's window is zeros
  // (0.25 rolled out), so the scale of step 5 (448 / 2 / 0.25) stays, and inf keeps it too.
  CHECK(scale[0] == 448.0f / 2.0f / 0.25f);
}

#include "model/fp8_linear.h"

namespace {

// The values a cast with this scale leaves: decode(encode(x * scale)) / scale, in float64.
std::vector<double> through_fp8(const std::vector<float>& x, float scale, Fp8Format f) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = double(cpu::fp8_decode(cpu::fp8_encode(x[i] * scale, f), f)) * double(1.0f / scale);
  return out;
}

Tensor host_tensor(const std::vector<float>& v, int64_t rows, int64_t cols) {
  Tensor t = Tensor::empty({rows, cols});
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

}  // namespace

TEST_CASE("fp8 linear: forward, dgrad and wgrad are the products of the cast operands", "[fp8]") {
  // Current scaling on the CPU: each tensor's scale is 448 (or 57344) / its amax, so the
  // reference can cast the operands itself and multiply in float64.
  const int64_t T = 24, K = 40, N = 24;
  Fp8Settings settings;
  settings.enabled = true;
  settings.recipe = Fp8Recipe::current;
  settings.linears = {kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj};
  Fp8Scaling scaling(settings, 1, host_arena());
  uint64_t seed = 11;
  auto random = [&](int64_t n, double s) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& e : v) e = float((2 * uniform01(seed) - 1) * s);
    return v;
  };
  const std::vector<float> x = random(T * K, 3.0), w = random(N * K, 0.05),
                           dy = random(T * N, 1e-3);
  const auto amax = [](const std::vector<float>& v) {
    float m = 0;
    for (float e : v) m = std::max(m, std::fabs(e));
    return m;
  };
  const std::vector<double> xq = through_fp8(x, 448.0f / amax(x), Fp8Format::e4m3);
  const std::vector<double> wq = through_fp8(w, 448.0f / amax(w), Fp8Format::e4m3);
  const std::vector<double> dyq = through_fp8(dy, 57344.0f / amax(dy), Fp8Format::e5m2);

  const Fp8Linear l{&scaling, 0, kUpProj};
  Fp8InputCasts forward_casts, backward_casts;
  const Tensor xt = host_tensor(x, T, K), wt = host_tensor(w, N, K), dyt = host_tensor(dy, T, N);
  const Tensor y = fp8_linear(xt, wt, l, forward_casts);
  Tensor dw = Tensor::zeros({N, K});
  dw.data<float>()[0] = 1.0f;  // accumulated into
  const Tensor dx = fp8_linear_backward(dyt, xt, wt, dw, l, backward_casts);

  double worst = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double want = 0, size = 0;
      for (int64_t k = 0; k < K; ++k) {
        want += xq[size_t(t * K + k)] * wq[size_t(n * K + k)];
        size += std::fabs(xq[size_t(t * K + k)] * wq[size_t(n * K + k)]);
      }
      worst = std::max(worst, std::fabs(y.data<float>()[t * N + n] - want) / size);
    }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      double want = 0, size = 0;
      for (int64_t n = 0; n < N; ++n) {
        want += dyq[size_t(t * N + n)] * wq[size_t(n * K + k)];
        size += std::fabs(dyq[size_t(t * N + n)] * wq[size_t(n * K + k)]);
      }
      worst = std::max(worst, std::fabs(dx.data<float>()[t * K + k] - want) / size);
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      double want = (n == 0 && k == 0) ? 1.0 : 0.0, size = want;
      for (int64_t t = 0; t < T; ++t) {
        want += dyq[size_t(t * N + n)] * xq[size_t(t * K + k)];
        size += std::fabs(dyq[size_t(t * N + n)] * xq[size_t(t * K + k)]);
      }
      worst = std::max(worst, std::fabs(dw.data<float>()[n * K + k] - want) / size);
    }
  // float accumulation of exact products: within a few float epsilons of sum |a b| (a wrong
  // transpose or scale would be off by O(1)).
  CHECK(worst < 4 * 40 * 6e-8);
  // The scales the casts set: the input's, the weight's and the gradient's.
  CHECK(scaling.input(0, kUpProj).scale.data<float>()[0] == 448.0f / amax(x));
  CHECK(scaling.gradient(0, kUpProj).scale.data<float>()[0] == 57344.0f / amax(dy));
}

TEST_CASE("fp8 code transpose: the codes of the transposed tensor, same scale", "[fp8]") {
  const int64_t rows = 13, cols = 37;  // not multiples of anything
  std::vector<float> x(size_t(rows * cols));
  uint64_t seed = 7;
  for (auto& v : x) v = float(frugal::uniform01(seed) * 8 - 4);
  Tensor t = Tensor::empty({rows, cols});
  std::copy(x.begin(), x.end(), t.data<float>());
  ops::Fp8Slot slot;
  slot.scale = Tensor::empty({1});
  slot.scale.data<float>()[0] = 50.0f;
  slot.scale_inv = Tensor::empty({1});
  slot.scale_inv.data<float>()[0] = 1.0f / 50.0f;
  slot.amax = Tensor::zeros({1});
  slot.counts = Tensor::zeros({3}, DType::i64);
  // A cast that writes both layouts is the independent reference for the transpose of codes.
  const ops::Fp8Cast both = ops::fp8_cast(t, slot, true, true);
  const ops::Fp8Matrix transposed = ops::fp8_transposed(both.plain);
  REQUIRE(transposed.codes.shape() == Shape({cols, rows}));
  CHECK(transposed.scale_inv.data<float>() == both.plain.scale_inv.data<float>());
  int64_t wrong = 0;
  for (int64_t i = 0; i < rows * cols; ++i)
    wrong += transposed.codes.data<uint8_t>()[i] != both.transposed.codes.data<uint8_t>()[i];
  CHECK(wrong == 0);
}
