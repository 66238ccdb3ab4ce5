// GaLore's randomized sketch (kernels/galore_sketch.h, kernels/cpu/galore.h): the CPU twin
// against a second implementation of its definition (core/random.h's SplitMix64 and uniform01,
// Box-Muller in float64), and its entries against the standard normal's moments.
#include <cmath>
#include <numbers>
#include <vector>

#include "catch_compat.h"
#include "core/random.h"
#include "kernels/cpu/galore.h"
#include "ops/ops.h"

using namespace frugal;

TEST_CASE("GaLore's sketch is Box-Muller on SplitMix64, entry by entry", "[galore]") {
  for (const uint64_t seed : {0ull, 1ull, 0xCBF29CE484222325ull}) {
    const int64_t count = 1031 * 37;  // not a multiple of anything the kernels tile by
    std::vector<float> omega(size_t(count), 0.0f);
    cpu::galore_sketch(omega.data(), count, seed);
    int64_t different = 0;
    for (int64_t i = 0; i < count; ++i) {
      uint64_t state = seed ^ (uint64_t(i) * 0xD1B54A32D192ED03ull);
      const double u1 = 1.0 - uniform01(state), u2 = uniform01(state);
      const double expected =
          std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
      if (omega[size_t(i)] != static_cast<float>(expected)) ++different;
    }
    INFO("seed " << seed);
    CHECK(different == 0);
  }
}

TEST_CASE("GaLore's sketch has the standard normal's moments", "[galore]") {
  Tensor omega = Tensor::empty({2000, 99}, DType::f32);
  ops::galore_sketch(omega, 42);
  double sum = 0, squares = 0, fourth = 0;
  const int64_t n = omega.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double x = omega.data<float>()[i];
    sum += x;
    squares += x * x;
    fourth += x * x * x * x;
  }
  // 198,000 draws: the mean's standard error is 0.0022, the variance's 0.0032, the fourth
  // moment's (E x^8 = 105) 0.022; the bounds are about five of them.
  CHECK(std::abs(sum / double(n)) < 0.012);
  CHECK(std::abs(squares / double(n) - 1.0) < 0.016);
  CHECK(std::abs(fourth / double(n) - 3.0) < 0.11);
  // Another seed draws another sketch.
  Tensor other = Tensor::empty({2000, 99}, DType::f32);
  ops::galore_sketch(other, 43);
  int64_t equal = 0;
  for (int64_t i = 0; i < n; ++i) equal += omega.data<float>()[i] == other.data<float>()[i];
  CHECK(equal < 10);
}
