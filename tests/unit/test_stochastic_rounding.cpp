// Stochastic rounding into bf16 (kernels/stochastic_rounding.h) against references computed in
// double from the bf16 grid itself: only the two neighbours of a value come out, the one above
// exactly as often as the fraction says (all 65536 low-bit patterns counted), the mean of many
// roundings with the counter-based bits is the value within a bound derived from the count,
// exact values and non-finite ones pass unchanged. And the bf16-master updates of AdamW and
// GaLore on the CPU: to nearest they equal the fp32 update rounded by core/dtype.h, stochastically
// they land on a neighbour of it, and a shard rounds its elements as the whole tensor does.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/galore.h"
#include "kernels/stochastic_rounding.h"

using namespace frugal;

namespace {

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

uint32_t to_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// The bf16 values next to a finite x, as doubles: the largest bf16 magnitude not above |x| and
// the smallest above it (for |x| beyond the largest finite bf16, inf), with x's sign. Found by
// walking the bf16 grid of magnitudes, not by x's bits.
struct Neighbours {
  uint16_t below = 0, above = 0;
  double fraction = 0;  // (|x| - |below|) / (|above| - |below|); 0 when x is on the grid
};
Neighbours neighbours(float x) {
  const double mag = std::fabs(static_cast<double>(x));
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  // Binary search over the positive bf16 codes 0 .. 0x7F80 (inf), which increase with value.
  uint32_t lo = 0, hi = 0x7F80;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (static_cast<double>(bf16_to_float(static_cast<uint16_t>(mid))) <= mag)
      lo = mid;
    else
      hi = mid;
  }
  Neighbours n;
  n.below = static_cast<uint16_t>(sign | lo);
  n.above = static_cast<uint16_t>(sign | hi);
  const double b = bf16_to_float(static_cast<uint16_t>(lo));
  // Beyond the largest finite bf16 the gap to "inf" is taken as one more step of the last
  // binade, 2^(127 - 7): the same carry that IEEE rounding has.
  const double a = hi == 0x7F80 ? b + std::ldexp(1.0, 127 - 7) : bf16_to_float(uint16_t(hi));
  n.fraction = (mag - b) / (a - b);
  return n;
}

// Finite test values of every kind: ordinary, tiny steps off the grid, near halves, negatives,
// subnormals, near the largest finite values.
std::vector<float> awkward_values() {
  std::vector<float> v = {1.0f + 0x1p-20f,
                          -1.0f - 0x1p-9f,
                          0.3f,
                          -0.7f,
                          3.14159265f,
                          1e-3f,
                          -2.5e-5f,
                          1e-40f,
                          -3e-39f,
                          6.5e4f,
                          1.5e38f,
                          -3.3e38f,
                          from_bits(0x7F7FFFFFu),
                          from_bits(0x3F808000u)};
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFFFFFFu);
  while (v.size() < 200) {
    const float x = from_bits(bits(gen));
    if (std::isfinite(x)) v.push_back(x);
  }
  return v;
}

}  // namespace

TEST_CASE("stochastic rounding gives one of the two neighbours, up as often as the fraction",
          "[stochastic_rounding]") {
  for (const float x : awkward_values()) {
    const Neighbours n = neighbours(x);
    // Every pattern of the 16 bits the rounding reads: the ones that round up are exactly the
    // fraction of 65536 (the dropped bits of x are a multiple of 2^-16 of the gap).
    int64_t up = 0, elsewhere = 0;
    for (uint32_t r = 0; r < 65536; ++r) {
      const uint16_t y = bf16_round_stochastic(x, r | (r << 16));  // high bits must not matter
      elsewhere += y != n.below && y != n.above;
      up += y == n.above;
    }
    INFO("x = " << x << " bits " << std::hex << to_bits(x) << std::dec << " fraction "
                << n.fraction);
    CHECK(elsewhere == 0);
    CHECK(static_cast<double>(up) == n.fraction * 65536.0);
  }
}

TEST_CASE("stochastic rounding is unbiased with the counter-based bits", "[stochastic_rounding]") {
  // N roundings of x, each below + ulp with probability f: the mean's standard deviation is
  // ulp sqrt(f (1 - f) / N); 6 of them bound it (a false failure once in ~5e8 runs).
  constexpr int64_t kCount = 1 << 16;
  const uint64_t key = stochastic_rounding_key(1234, 17, parameter_rounding_id("w", 1));
  const float values[] = {1.0f + 0x1p-9f,  // a quarter of an ulp above 1
                          -0.3f,          0.01f,    1.0f + 0x1p-22f, 1.0f + 0x1p-7f - 0x1p-22f,
                          1e-39f,         -123.456f};
  for (const float x : values) {
    const Neighbours n = neighbours(x);
    const double below = bf16_to_float(n.below), above = bf16_to_float(n.above);
    double sum = 0;
    int64_t up = 0;
    for (int64_t i = 0; i < kCount; ++i) {
      const uint16_t y = bf16_round_stochastic(x, stochastic_rounding_bits(key, i));
      sum += bf16_to_float(y);
      up += y == n.above;
    }
    const double ulp = std::fabs(above - below), f = n.fraction;
    const double sigma = std::sqrt(f * (1 - f) / kCount);
    INFO("x = " << x << " fraction " << f << " ups " << up);
    CHECK(std::fabs(sum / kCount - static_cast<double>(x)) <= 6 * ulp * sigma + 1e-12 * ulp);
    CHECK(std::fabs(static_cast<double>(up) - kCount * f) <= 6 * kCount * sigma + 1e-9);
  }
}

TEST_CASE("the rounding bits are uniform and differ by element, step, seed and parameter",
          "[stochastic_rounding]") {
  // Chi-square of the 16 bits the rounding reads, in 256 bins, over 2^18 elements: 255 degrees
  // of freedom, mean 255 and standard deviation sqrt(510) = 22.6; 6 of them above is 391.
  // And of the pairs (element i, i + 1)'s top 4 of those bits: a correlated neighbour would
  // show there.
  constexpr int64_t kCount = 1 << 18;
  const uint64_t key = stochastic_rounding_key(42, 3, parameter_rounding_id("model.w", 7));
  std::vector<int64_t> bins(256, 0), pairs(256, 0);
  uint32_t previous = stochastic_rounding_bits(key, 0);
  for (int64_t i = 0; i < kCount; ++i) {
    const uint32_t r = stochastic_rounding_bits(key, i) & 0xFFFFu;
    ++bins[r >> 8];
    if (i > 0) ++pairs[((previous >> 12) << 4) | (r >> 12)];
    previous = r;
  }
  const auto chi2 = [](const std::vector<int64_t>& counts, double total) {
    const double expected = total / double(counts.size());
    double sum = 0;
    for (const int64_t c : counts)
      sum += (double(c) - expected) * (double(c) - expected) / expected;
    return sum;
  };
  CHECK(chi2(bins, kCount) < 391);
  CHECK(chi2(pairs, kCount - 1) < 391);
  // Each part of the key changes the bits (a sharded or resumed run draws the same only where
  // all of them agree).
  const uint64_t id = parameter_rounding_id("a", 1);
  const uint64_t base = stochastic_rounding_key(1, 1, id);
  int same_step = 0, same_seed = 0, same_param = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const uint32_t r = stochastic_rounding_bits(base, i);
    same_step += r == stochastic_rounding_bits(stochastic_rounding_key(1, 2, id), i);
    same_seed += r == stochastic_rounding_bits(stochastic_rounding_key(2, 1, id), i);
    same_param += r == stochastic_rounding_bits(
                           stochastic_rounding_key(1, 1, parameter_rounding_id("b", 1)), i);
  }
  CHECK(same_step < 2);
  CHECK(same_seed < 2);
  CHECK(same_param < 2);
  CHECK(parameter_rounding_id("a", 1) != parameter_rounding_id("b", 1));
}

TEST_CASE("exact and non-finite values pass stochastic rounding unchanged",
          "[stochastic_rounding]") {
  const uint32_t randoms[] = {0u, 1u, 0x7FFFu, 0x8000u, 0xFFFFu, 0xFFFFFFFFu, 0x12345678u};
  int64_t changed = 0, nan_lost = 0;
  for (uint32_t code = 0; code < 0x10000; ++code) {
    const float x = bf16_to_float(static_cast<uint16_t>(code));
    for (const uint32_t r : randoms) {
      const uint16_t y = bf16_round_stochastic(x, r);
      if (std::isnan(x))
        nan_lost += !std::isnan(bf16_to_float(y));  // NaN stays NaN, never inf
      else
        changed += y != code;  // bf16 values, +-0 and +-inf included
    }
  }
  CHECK(changed == 0);
  CHECK(nan_lost == 0);
  // A float NaN whose payload lies only in the bits bf16 drops stays NaN.
  CHECK(std::isnan(bf16_to_float(bf16_round_stochastic(from_bits(0x7F800001u), 0xFFFFu))));
  CHECK(std::isnan(bf16_to_float(bf16_round_stochastic(from_bits(0xFF800001u), 0u))));
  // Overflow: the largest finite float rounds to the largest finite bf16 or to inf, as the
  // fraction says (65535 / 65536 of the way).
  CHECK(bf16_round_stochastic(from_bits(0x7F7FFFFFu), 0u) == 0x7F7F);
  CHECK(bf16_round_stochastic(from_bits(0x7F7FFFFFu), 1u) == 0x7F80);
  CHECK(bf16_round_stochastic(from_bits(0xFF7FFFFFu), 1u) == 0xFF80);
}

TEST_CASE("bf16 round to nearest in the shared header equals core/dtype.h's",
          "[stochastic_rounding]") {
  std::mt19937 gen(11);
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFFFFFFu);
  int64_t differ = 0;
  for (int i = 0; i < (1 << 20); ++i) {
    const float x = from_bits(bits(gen));
    differ += bf16_round_nearest(x) != float_to_bf16(x);
  }
  CHECK(differ == 0);
  for (const float x : {0.0f, -0.0f, std::numeric_limits<float>::infinity(), from_bits(0x7F7F8000u),
                        from_bits(0x3F808000u), from_bits(0x3F818000u)})
    CHECK(bf16_round_nearest(x) == float_to_bf16(x));
  const Bf16Store nearest;
  CHECK(bf16_store(1.0f + 0x1p-9f, nearest, 5) == float_to_bf16(1.0f + 0x1p-9f));
}

namespace {

// n bf16 weights, gradients and fp32 moments of awkward sizes and magnitudes.
struct Bf16Master {
  std::vector<uint16_t> param, grad;
  std::vector<float> m, v;
};
Bf16Master random_master(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Bf16Master s;
  for (int64_t i = 0; i < n; ++i) {
    s.param.push_back(float_to_bf16(0.05f * normal(gen)));
    s.grad.push_back(float_to_bf16(1e-3f * normal(gen)));
    s.m.push_back(1e-4f * normal(gen));
    s.v.push_back(1e-7f * std::fabs(normal(gen)));
  }
  return s;
}

cpu::AdamWStep small_step() {
  cpu::AdamWStep s;
  s.lr = 1e-4f;  // updates of a fraction of a bf16 step: where the two roundings differ
  s.weight_decay = 0.1f;
  s.step = 7;
  s.grad_scale = 0.8f;
  return s;
}

}  // namespace

TEST_CASE("AdamW on a bf16 master: the fp32 update, rounded to nearest or to a neighbour",
          "[stochastic_rounding]") {
  constexpr int64_t n = 40009;  // several OpenMP blocks and a ragged end
  const Bf16Master start = random_master(n, 3);
  const cpu::AdamWStep step = small_step();
  // The reference: the fp32 update of the widened weights (kernels/cpu/adamw's own loop).
  std::vector<float> p32(n), g32(n), m32 = start.m, v32 = start.v;
  for (int64_t i = 0; i < n; ++i) {
    p32[i] = bf16_to_float(start.param[i]);
    g32[i] = bf16_to_float(start.grad[i]);
  }
  cpu::adamw_update(p32.data(), g32.data(), m32.data(), v32.data(), n, step);

  Bf16Master nearest = start;
  cpu::adamw_update_bf16(nearest.param.data(), nearest.grad.data(), nearest.m.data(),
                         nearest.v.data(), n, step, Bf16Store());
  Bf16Master stochastic = start;
  Bf16Store store{true, stochastic_rounding_key(5, 7, parameter_rounding_id("w", 1)), 0};
  cpu::adamw_update_bf16(stochastic.param.data(), stochastic.grad.data(), stochastic.m.data(),
                         stochastic.v.data(), n, step, store);
  int64_t differ = 0, unchanged_nearest = 0, unchanged_stochastic = 0;
  for (int64_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(nearest.param[i] == float_to_bf16(p32[i]));
    REQUIRE(nearest.m[i] == m32[i]);
    REQUIRE(nearest.v[i] == v32[i]);
    REQUIRE(stochastic.m[i] == m32[i]);
    const Neighbours nb = neighbours(p32[i]);
    REQUIRE((stochastic.param[i] == nb.below || stochastic.param[i] == nb.above));
    differ += stochastic.param[i] != nearest.param[i];
    unchanged_nearest += nearest.param[i] == start.param[i];
    unchanged_stochastic += stochastic.param[i] == start.param[i];
  }
  // The step is below half a bf16 step for most weights: nearest loses most updates, the
  // stochastic rounding moves a share of the weights by one step.
  CHECK(differ > n / 20);
  CHECK(unchanged_stochastic < unchanged_nearest);

  // bf16 moments: each rounded to nearest from the fp32 moment math.
  std::vector<uint16_t> m16(n), v16(n);
  std::vector<float> pw(n), m_wide(n), v_wide(n);
  for (int64_t i = 0; i < n; ++i) {
    m16[i] = float_to_bf16(start.m[i]);
    v16[i] = float_to_bf16(start.v[i]);
    m_wide[i] = bf16_to_float(m16[i]);
    v_wide[i] = bf16_to_float(v16[i]);
    pw[i] = bf16_to_float(start.param[i]);
  }
  cpu::adamw_update(pw.data(), g32.data(), m_wide.data(), v_wide.data(), n, step);
  Bf16Master all_bf16 = start;
  cpu::adamw_update_bf16(all_bf16.param.data(), all_bf16.grad.data(), m16.data(), v16.data(), n,
                         step, Bf16Store());
  for (int64_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(all_bf16.param[i] == float_to_bf16(pw[i]));
    REQUIRE(m16[i] == float_to_bf16(m_wide[i]));
    REQUIRE(v16[i] == float_to_bf16(v_wide[i]));
  }
}

TEST_CASE("a shard of a bf16 master rounds its elements as the whole tensor does",
          "[stochastic_rounding]") {
  constexpr int64_t n = 1003, split = 371;  // two uneven shards
  const Bf16Master start = random_master(n, 9);
  const cpu::AdamWStep step = small_step();
  const uint64_t key = stochastic_rounding_key(5, 7, parameter_rounding_id("w", 1));
  Bf16Master whole = start, shards = start, unshifted = start;
  cpu::adamw_update_bf16(whole.param.data(), whole.grad.data(), whole.m.data(), whole.v.data(), n,
                         step, Bf16Store{true, key, 0});
  cpu::adamw_update_bf16(shards.param.data(), shards.grad.data(), shards.m.data(), shards.v.data(),
                         split, step, Bf16Store{true, key, 0});
  cpu::adamw_update_bf16(shards.param.data() + split, shards.grad.data() + split,
                         shards.m.data() + split, shards.v.data() + split, n - split, step,
                         Bf16Store{true, key, split});
  CHECK(shards.param == whole.param);
  CHECK(shards.m == whole.m);
  // The offset matters: the second shard rounded as if it began the tensor differs.
  cpu::adamw_update_bf16(unshifted.param.data() + split, unshifted.grad.data() + split,
                         unshifted.m.data() + split, unshifted.v.data() + split, n - split, step,
                         Bf16Store{true, key, 0});
  CHECK(unshifted.param != whole.param);

  // GaLore's apply likewise; to nearest it is the fp32 apply rounded.
  std::vector<float> delta(n), p32(n);
  for (int64_t i = 0; i < n; ++i) {
    delta[i] = bf16_to_float(start.grad[i]) * 3.0f;
    p32[i] = bf16_to_float(start.param[i]);
  }
  std::vector<uint16_t> galore_whole = start.param, galore_shards = start.param,
                        galore_nearest = start.param;
  cpu::galore_apply_bf16(galore_whole.data(), delta.data(), n, -0.01f, -1e-5f,
                         Bf16Store{true, key, 0});
  cpu::galore_apply_bf16(galore_shards.data(), delta.data(), split, -0.01f, -1e-5f,
                         Bf16Store{true, key, 0});
  cpu::galore_apply_bf16(galore_shards.data() + split, delta.data() + split, n - split, -0.01f,
                         -1e-5f, Bf16Store{true, key, split});
  CHECK(galore_shards == galore_whole);
  cpu::galore_apply_bf16(galore_nearest.data(), delta.data(), n, -0.01f, -1e-5f, Bf16Store());
  cpu::galore_apply(p32.data(), delta.data(), n, -0.01f, -1e-5f, nullptr);
  for (int64_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(galore_nearest[i] == float_to_bf16(p32[i]));
    const Neighbours nb = neighbours(p32[i]);
    REQUIRE((galore_whole[i] == nb.below || galore_whole[i] == nb.above));
  }
}
