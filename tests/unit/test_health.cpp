// The health monitor's pieces: the gradient pass's counts against a brute force over
// frugal's own bf16 rounding, its sum against sum_squares bit for bit, the sums by unit and
// rank, the loss-spike score against a float64 mean and deviation, the slow-rank rule, and the
// new fault kinds.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "monitor/gpu_sensors.h"
#include "monitor/health.h"
#include "ops/ops.h"
#include "test_support.h"
#include "train/fault_injection.h"

using namespace frugal;
using namespace frugal::test;

namespace {

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The counts by the definition: round each value with float_to_bf16 and look at the result.
ops::GradHealth brute_force(const std::vector<float>& v) {
  ops::GradHealth h;
  h.count = int64_t(v.size());
  for (float x : v) {
    if (!std::isfinite(x)) {
      ++h.nonfinite;
      continue;
    }
    const float b = bf16_to_float(float_to_bf16(x));
    if (std::isinf(b)) ++h.bf16_overflow;
    if (x != 0 && std::abs(b) < FLT_MIN) ++h.bf16_underflow;
  }
  return h;
}

}  // namespace

TEST_CASE("gradient pass: counts as bf16 rounding makes them, the sum as sum_squares", "[health]") {
  std::mt19937 rng(7);
  // Awkward sizes (chunks of 2^14 and lanes of 8 split unevenly), and values around every edge:
  // the tie below the smallest normal bf16, subnormals, the largest finite bf16 and its tie
  // with inf, NaN and inf.
  const uint32_t edges[] = {0x00000001u, 0x007F7FFFu, 0x007F8000u, 0x007F8001u, 0x00800000u,
                            0x7F7F7FFFu, 0x7F7F8000u, 0x7F7FFFFFu, 0x7F800000u, 0x7FC00000u,
                            0x80000001u, 0xFF7F8000u, 0x00000000u, 0x80000000u};
  for (int64_t n : {int64_t(1), int64_t(13), int64_t(16385), int64_t(40003)}) {
    std::vector<float> v(static_cast<size_t>(n));
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    for (float& x : v) x = normal(rng);
    for (size_t i = 0; i < v.size(); ++i)
      if (rng() % 7 == 0) v[i] = from_bits(edges[rng() % std::size(edges)]);
    // A finite copy for the sum comparison.
    std::vector<float> finite = v;
    for (float& x : finite)
      if (!std::isfinite(x)) x = 1.5f;
    Tensor t = Tensor::empty({n});
    std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
    Tensor f = Tensor::empty({n});
    std::memcpy(f.raw(), finite.data(), finite.size() * sizeof(float));

    const ops::GradHealth expected = brute_force(v);
    const std::vector<ops::GradHealth> got = ops::grad_health({t, f});
    REQUIRE(got.size() == 2);
    CHECK(got[0].count == n);
    CHECK(got[0].nonfinite == expected.nonfinite);
    CHECK(got[0].bf16_underflow == expected.bf16_underflow);
    CHECK(got[0].bf16_overflow == expected.bf16_overflow);
    CHECK((expected.nonfinite == 0 || !std::isfinite(got[0].sum_squares)));
    // The finite tensor: its sum is sum_squares' bit for bit, and within rounding of float64's.
    CHECK(got[1].sum_squares == ops::sum_squares({f}));
    // Summed in order, the per-tensor sums are sum_squares of the list (the step's norm).
    const std::vector<ops::GradHealth> twice = ops::grad_health({f, f});
    CHECK(twice[0].sum_squares + twice[1].sum_squares == ops::sum_squares({f, f}));
    long double reference = 0;
    for (float x : finite) reference += (long double)x * x;
    CHECK(std::abs(double(reference) - got[1].sum_squares) <= 1e-12 * double(reference) + 1e-300);
  }
}

TEST_CASE("gradient health: units, ranks, the first non-finite unit", "[health]") {
  // Three tensors in units 0, 2, 2 of three; the "other rank" doubles every sum.
  std::vector<ops::GradHealth> tensors = {
      {4.0, 0, 1, 0, 10}, {9.0, 0, 0, 2, 20}, {16.0, 0, 0, 0, 30}};
  const std::vector<size_t> unit_of = {0, 2, 2};
  const std::vector<std::string> names = {"embed", "layers.0", "head"};
  auto two_ranks = [](std::vector<double>& v) {
    for (double& x : v) x *= 2;
  };
  GradientHealth h = gradient_health(tensors, unit_of, names, two_ranks);
  REQUIRE(h.units.size() == 3);
  CHECK(h.units[0].norm == Approx(std::sqrt(8.0)));
  CHECK(h.units[1].norm == 0);
  CHECK(h.units[2].norm == Approx(std::sqrt(50.0)));
  CHECK(h.norm == Approx(std::sqrt(58.0)));
  CHECK(h.nonfinite == 0);
  CHECK(h.first_nonfinite_unit.empty());
  CHECK(h.bf16.values == 120);
  CHECK(h.bf16.underflow == Approx(2.0 / 120));
  CHECK(h.bf16.overflow == Approx(4.0 / 120));
  // A NaN in the head: its tensor's sum leaves the norm; the head is named.
  tensors[2] = {std::numeric_limits<double>::quiet_NaN(), 3, 0, 0, 30};
  h = gradient_health(tensors, unit_of, names, [](std::vector<double>&) {});
  CHECK(h.nonfinite == 3);
  CHECK(h.first_nonfinite_unit == "head");
  CHECK(h.units[2].nonfinite == 3);
  CHECK(h.norm == Approx(std::sqrt(13.0)));
}

TEST_CASE("loss spikes: the z-score over the window, spikes and rollbacks", "[health]") {
  LossSpikeDetector d(5, 4.0);
  CHECK(std::isnan(d.z_score(3.0)));  // fewer than min(window, 10) losses
  const double losses[] = {3.0, 3.2, 2.9, 3.1, 2.8, 3.0};
  for (int i = 0; i < 6; ++i) d.add(i + 1, losses[i]);
  // The window holds the last 5: 3.2 2.9 3.1 2.8 3.0, mean 3.0, sample deviation sqrt(0.025).
  const double sd = std::sqrt((0.04 + 0.01 + 0.01 + 0.04 + 0.0) / 4);
  CHECK(d.z_score(3.5) == Approx((3.5 - 3.0) / sd));
  CHECK(!d.is_spike(3.5));  // z = 3.2
  CHECK(d.is_spike(3.7));   // z = 4.4
  CHECK(d.is_spike(std::numeric_limits<double>::quiet_NaN()));
  CHECK(!d.is_spike(1.0));  // a drop is no spike
  // A rollback to step 4 forgets steps 5 and 6: the window is 3.2 2.9 3.1, too few again.
  d.forget_after(4);
  CHECK(std::isnan(d.z_score(3.03)));
  d.add(5, 3.0);
  d.add(6, 2.95);  // 3.2 2.9 3.1 3.0 2.95: mean 3.03
  CHECK(d.z_score(3.03) == Approx(0.0).margin(1e-12));
  // A flat window: the spread is at least 1 % of the mean.
  LossSpikeDetector flat(3, 6.0);
  for (int i = 0; i < 3; ++i) flat.add(i, 2.0);
  CHECK(flat.z_score(2.1) == Approx(0.1 / 0.02));
}

TEST_CASE("slow ranks: the busiest against the median of the others", "[health]") {
  auto timing = [](std::vector<double> busy) {
    std::vector<RankTiming> t;
    for (double b : busy) t.push_back({0.3, b, std::nullopt});
    return t;
  };
  RankReport r = rank_report(timing({0.10, 0.31, 0.11, 0.09}), 1.5);
  CHECK(r.slowest == 1);
  CHECK(r.others_median_busy == Approx(0.10));
  CHECK(r.slow);
  // Busier, but not by the factor; and a small step's noise.
  CHECK(!rank_report(timing({0.10, 0.14, 0.11}), 1.5).slow);
  CHECK(!rank_report(timing({0.002, 0.014}), 1.5).slow);
  CHECK(!rank_report(timing({0.2}), 1.5).slow);
  HealthRecord record;
  record.loss_z = std::numeric_limits<double>::quiet_NaN();
  record.ranks = r;
  record.casts["bf16_grad"] = {0.25, 0.0, 8};
  record.casts["fp8_e4m3_weights"] = {0.5, 0.125, 16};  // as FP8's code adds its own
  const nlohmann::json j = record.to_json();
  CHECK(j["loss_z"].is_null());
  CHECK(j["ranks"]["slowest"] == 1);
  CHECK(j["ranks"]["slow"] == true);
  CHECK(j["casts"]["fp8_e4m3_weights"]["overflow"] == 0.125);
  CHECK(j["casts"]["bf16_grad"]["underflow"] == 0.25);
}

TEST_CASE("GPU sensors: throttle reasons by name, no NVML is no error", "[health]") {
  CHECK(throttle_reason_names(0x1 | 0x2).empty());  // idle, application clocks: no slowdown
  CHECK(!is_throttling(0x1));
  CHECK(throttle_reason_names(0x4 | 0x20) ==
        std::vector<std::string>{"sw_power_cap", "sw_thermal"});
  CHECK(is_throttling(0x10));
  std::string why;
  std::unique_ptr<Nvml> nvml = Nvml::load(&why);
  CHECK((nvml != nullptr || !why.empty()));
}

TEST_CASE("fault injection: the health faults", "[health]") {
  using Kind = FaultInjection::Kind;
  const FaultInjection nan = parse_fault_injection("nan:1:7");
  CHECK(nan.kind == Kind::nan);
  CHECK(nan.at(Kind::nan, 1, 7));
  CHECK(!nan.at(Kind::nan, 0, 7));
  CHECK(!nan.at(Kind::nan, 1, 8));
  const FaultInjection slow = parse_fault_injection("slow:0:3");
  CHECK(slow.at(Kind::slow, 0, 3));
  CHECK(slow.at(Kind::slow, 0, 30));  // from that step on
  CHECK(!slow.at(Kind::slow, 0, 2));
  CHECK(parse_fault_injection("spike:0:2").kind == Kind::spike);
  CHECK(parse_fault_injection("bitflip:1:5").kind == Kind::bitflip);
  CHECK(parse_fault_injection("recompute:0:4").kind == Kind::recompute);
  CHECK(contains(error_of([] { parse_fault_injection("flip:0:4"); }), "bitflip, recompute"));
  inject_fault(nan, 1, 7);  // the loop's and the monitor's to inject: nothing happens here
}
