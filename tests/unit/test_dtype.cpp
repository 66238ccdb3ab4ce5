// dtype conversions against independent references: every code of every narrow format decoded
// by the textbook formula, and the encoder checked by brute-force nearest-value search.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "core/error.h"

using namespace frugal;

namespace {

enum class Overflow { to_inf, saturate };

// A narrow format described only by its field widths; everything below derives from the
// formula sign * 2^(e - bias) * (1 + m / 2^mbits), or 2^(1 - bias) * (m / 2^mbits) when e == 0.
struct RefFormat {
  const char* name;
  int ebits;
  int mbits;
  int bias;
  bool ieee_specials;  // exponent all ones: inf (m == 0) and NaN; else only code 0x7F is NaN
  Overflow overflow;
  uint16_t (*encode)(float);
  float (*decode)(uint16_t);

  int bits() const { return 1 + ebits + mbits; }
  uint32_t sign_bit() const { return 1u << (ebits + mbits); }
  uint32_t code_count() const { return 1u << bits(); }

  // NaN and inf as doubles; finite codes exactly.
  double value(uint32_t code) const {
    const bool negative = code & sign_bit();
    const uint32_t e = (code >> mbits) & ((1u << ebits) - 1);
    const uint32_t m = code & ((1u << mbits) - 1);
    const uint32_t e_all_ones = (1u << ebits) - 1;
    double magnitude;
    if (ieee_specials && e == e_all_ones) {
      magnitude = m == 0 ? std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
    } else if (!ieee_specials && e == e_all_ones && m == (1u << mbits) - 1) {
      magnitude = std::numeric_limits<double>::quiet_NaN();
    } else if (e == 0) {
      magnitude = std::ldexp(double(m) / double(1u << mbits), 1 - bias);
    } else {
      magnitude = std::ldexp(1.0 + double(m) / double(1u << mbits), int(e) - bias);
    }
    return negative ? -magnitude : magnitude;
  }

  // Non-negative finite values with their codes, ascending (the codes are monotonic).
  std::vector<std::pair<double, uint32_t>> positive_finite() const {
    std::vector<std::pair<double, uint32_t>> out;
    for (uint32_t code = 0; code < sign_bit(); ++code) {
      double v = value(code);
      if (std::isfinite(v)) out.push_back({v, code});
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

uint16_t enc_bf16(float x) { return float_to_bf16(x); }
float dec_bf16(uint16_t c) { return bf16_to_float(c); }
uint16_t enc_f16(float x) { return float_to_f16(x); }
float dec_f16(uint16_t c) { return f16_to_float(c); }
uint16_t enc_e4m3(float x) { return float_to_e4m3(x); }
float dec_e4m3(uint16_t c) { return e4m3_to_float(static_cast<uint8_t>(c)); }
uint16_t enc_e5m2(float x) { return float_to_e5m2(x); }
float dec_e5m2(uint16_t c) { return e5m2_to_float(static_cast<uint8_t>(c)); }

const RefFormat kRefBF16 = {"bf16", 8, 7, 127, true, Overflow::to_inf, enc_bf16, dec_bf16};
const RefFormat kRefF16 = {"f16", 5, 10, 15, true, Overflow::to_inf, enc_f16, dec_f16};
const RefFormat kRefE4M3 = {"e4m3", 4, 3, 7, false, Overflow::saturate, enc_e4m3, dec_e4m3};
const RefFormat kRefE5M2 = {"e5m2", 5, 2, 15, true, Overflow::saturate, enc_e5m2, dec_e5m2};

// The reference encoder: nearest finite value by search over the sorted table, ties to the
// even code (= even mantissa), overflow to inf or saturation as the format says.
class RefEncoder {
 public:
  explicit RefEncoder(const RefFormat& fmt) : fmt_(fmt), table_(fmt.positive_finite()) {}

  // The expected code for a finite or infinite, non-NaN x.
  uint32_t encode(float x) const {
    const uint32_t sign = std::signbit(x) ? fmt_.sign_bit() : 0;
    const double a = std::fabs(double(x));
    const auto& [max_value, max_code] = table_.back();
    if (a > max_value) {
      if (fmt_.overflow == Overflow::saturate) return sign | max_code;
      // IEEE: round as if the exponent were unbounded; the next value past max is 2^(emax+1).
      const double next = max_value + std::ldexp(1.0, (int)std::ilogb(max_value) - fmt_.mbits);
      const uint32_t inf_code = ((1u << fmt_.ebits) - 1) << fmt_.mbits;
      // The tie goes to inf: max has an all-ones (odd) mantissa.
      return sign | (a >= (max_value + next) / 2 ? inf_code : max_code);
    }
    auto upper = std::lower_bound(table_.begin(), table_.end(), std::make_pair(a, uint32_t(0)));
    if (upper->first == a) return sign | upper->second;
    auto lower = upper - 1;
    const double below = a - lower->first, above = upper->first - a;
    if (below < above) return sign | lower->second;
    if (above < below) return sign | upper->second;
    return sign | ((lower->second & 1) == 0 ? lower->second : upper->second);
  }

  const std::vector<std::pair<double, uint32_t>>& table() const { return table_; }

 private:
  const RefFormat& fmt_;
  std::vector<std::pair<double, uint32_t>> table_;
};

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

void check_decoder(const RefFormat& fmt) {
  INFO("format " << fmt.name);
  for (uint32_t code = 0; code < fmt.code_count(); ++code) {
    const double expected = fmt.value(code);
    const float got = fmt.decode(static_cast<uint16_t>(code));
    if (std::isnan(expected)) {
      if (!std::isnan(got)) FAIL("code " << code << " decodes to " << got << ", expected NaN");
    } else if (!same_bits(got, static_cast<float>(expected)) || double(got) != expected) {
      FAIL("code " << code << " decodes to " << got << ", expected " << expected);
    }
  }
}

// Float inputs that probe every boundary of the format: every value, the exact midpoint
// between neighbours (a tie), one float ulp either side of it, and values past the top.
std::vector<float> adversarial_inputs(const RefEncoder& ref) {
  std::vector<float> xs;
  const auto& table = ref.table();
  auto push_around = [&xs](double v) {
    if (v > FLT_MAX) {  // past float's range: the float input is inf
      xs.push_back(std::numeric_limits<float>::infinity());
      return;
    }
    const float f = static_cast<float>(v);
    xs.push_back(f);
    xs.push_back(std::nextafter(f, 0.0f));
    xs.push_back(std::nextafter(f, std::numeric_limits<float>::infinity()));
  };
  for (size_t i = 0; i < table.size(); ++i) {
    push_around(table[i].first);
    if (i + 1 < table.size()) push_around((table[i].first + table[i + 1].first) / 2);
  }
  const double max = table.back().first, ulp = max - table[table.size() - 2].first;
  for (double v : {max + ulp / 2, max + ulp, max + 2 * ulp, max * 2, max * 1000.0}) push_around(v);
  // Below the smallest subnormal: half of it (ties to 0), a quarter, and float's own tiny values.
  const double min_sub = table[1].first;
  for (double v : {min_sub / 2, min_sub / 4, min_sub * 0.75, min_sub * 1.5}) push_around(v);
  for (float v : {std::numeric_limits<float>::denorm_min(), FLT_MIN, FLT_MAX, 1e-30f, 1.0f, 0.0f})
    push_around(v);
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
  xs.push_back(-0.0f);
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  return xs;
}

// Random floats: random bit patterns, and random values spread over the format's exponents.
std::vector<float> random_inputs(const RefFormat& fmt, size_t count) {
  std::mt19937 rng(1234);
  std::vector<float> xs;
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_int_distribution<int> exponent(-fmt.bias - fmt.mbits - 3,
                                              (1 << fmt.ebits) - fmt.bias + 1);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (size_t i = 0; i < count; ++i) {
    float x = i % 2 ? std::bit_cast<float>(any_bits(rng))
                    : std::ldexp(mantissa(rng), std::max(exponent(rng), -126));
    if (std::isnan(x)) x = 1.0f;
    if (i % 3 == 0) x = -x;
    xs.push_back(x);
  }
  return xs;
}

void check_encoder(const RefFormat& fmt, const std::vector<float>& xs) {
  RefEncoder ref(fmt);
  INFO("format " << fmt.name);
  size_t failures = 0;
  for (float x : xs) {
    const uint32_t expected = ref.encode(x);
    const uint32_t got = fmt.encode(x);
    if (got != expected && ++failures <= 10)
      FAIL_CHECK("encode(" << x << " = 0x" << std::hex << std::bit_cast<uint32_t>(x) << ") = 0x"
                           << got << ", expected 0x" << expected);
  }
  CHECK(failures == 0);
}

void check_nan(const RefFormat& fmt) {
  INFO("format " << fmt.name);
  for (float nan :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
        std::bit_cast<float>(0x7F800001u), std::bit_cast<float>(0xFFC00001u)}) {
    const uint16_t code = fmt.encode(nan);
    CHECK(std::isnan(fmt.value(code)));
    CHECK(std::isnan(fmt.decode(code)));
  }
}

}  // namespace

TEST_CASE("dtype names and sizes") {
  const DType all[] = {DType::f32,  DType::f64, DType::bf16, DType::f16, DType::e4m3,
                       DType::e5m2, DType::u8,  DType::i32,  DType::i64};
  const char* names[] = {"f32", "f64", "bf16", "f16", "e4m3", "e5m2", "u8", "i32", "i64"};
  const size_t sizes[] = {4, 8, 2, 2, 1, 1, 1, 4, 8};
  for (int i = 0; i < 9; ++i) {
    CHECK(dtype_name(all[i]) == names[i]);
    CHECK(dtype_from_name(names[i]) == all[i]);
    CHECK(dtype_bytes(all[i]) == sizes[i]);
  }
  REQUIRE_THROWS_AS(dtype_from_name("fp32"), frugal::Error);
  try {
    dtype_from_name("float8");
    FAIL("no throw");
  } catch (const frugal::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("unknown dtype 'float8'") != std::string::npos);
    CHECK(what.find("e4m3") != std::string::npos);
  }
}

TEST_CASE("decoders match the textbook formula on every code") {
  check_decoder(kRefE4M3);
  check_decoder(kRefE5M2);
  check_decoder(kRefF16);
  check_decoder(kRefBF16);
}

TEST_CASE("encoders pick the nearest value, ties to even") {
  for (const RefFormat* fmt : {&kRefE4M3, &kRefE5M2, &kRefF16, &kRefBF16}) {
    SECTION(std::string("adversarial ") + fmt->name) {
      check_encoder(*fmt, adversarial_inputs(RefEncoder(*fmt)));
    }
    SECTION(std::string("random ") + fmt->name) {
      check_encoder(*fmt, random_inputs(*fmt, 200000));
    }
    SECTION(std::string("NaN ") + fmt->name) { check_nan(*fmt); }
  }
}

TEST_CASE("published constants") {
  // OCP FP8 spec: E4M3 (FN) max 448 = S.1111.110, min subnormal 2^-9; E5M2 max 57344 = S.11110.11,
  // min subnormal 2^-16.
  CHECK(float_to_e4m3(448.0f) == 0x7E);
  CHECK(float_to_e4m3(-448.0f) == 0xFE);
  CHECK(e4m3_to_float(0x7E) == 448.0f);
  CHECK(e4m3_to_float(0x01) == std::ldexp(1.0f, -9));
  CHECK(float_to_e4m3(std::ldexp(1.0f, -9)) == 0x01);
  CHECK(std::isnan(e4m3_to_float(0x7F)));
  CHECK(std::isnan(e4m3_to_float(0xFF)));
  CHECK(kE4M3Max == 448.0f);
  CHECK(float_to_e5m2(57344.0f) == 0x7B);
  CHECK(e5m2_to_float(0x7B) == 57344.0f);
  CHECK(e5m2_to_float(0x01) == std::ldexp(1.0f, -16));
  CHECK(float_to_e5m2(std::ldexp(1.0f, -16)) == 0x01);
  CHECK(kE5M2Max == 57344.0f);
  CHECK(std::isinf(e5m2_to_float(0x7C)));
  CHECK(float_to_bf16(1.0f) == 0x3F80);
  CHECK(bf16_to_float(0x3F80) == 1.0f);
  CHECK(float_to_f16(65504.0f) == 0x7BFF);
  CHECK(f16_to_float(0x7BFF) == 65504.0f);
  CHECK(float_to_f16(1.0f) == 0x3C00);
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0f, -24));
}

TEST_CASE("saturation and overflow") {
  const float inf = std::numeric_limits<float>::infinity();
  // FP8 saturates finite overflow and infinities.
  CHECK(float_to_e4m3(449.0f) == 0x7E);
  CHECK(float_to_e4m3(464.0f) == 0x7E);  // halfway to the (NaN) code 0x7F
  CHECK(float_to_e4m3(1e30f) == 0x7E);
  CHECK(float_to_e4m3(inf) == 0x7E);
  CHECK(float_to_e4m3(-inf) == 0xFE);
  CHECK(float_to_e5m2(61440.0f) == 0x7B);  // halfway to where inf would be
  CHECK(float_to_e5m2(inf) == 0x7B);
  CHECK(float_to_e5m2(-inf) == 0xFB);
  CHECK(float_to_e5m2(-1e38f) == 0xFB);
  // f16 and bf16 overflow to inf, IEEE style: 65520 is the tie between 65504 and 2^16.
  CHECK(float_to_f16(std::nextafter(65520.0f, 0.0f)) == 0x7BFF);
  CHECK(float_to_f16(65520.0f) == 0x7C00);
  CHECK(float_to_f16(-inf) == 0xFC00);
  CHECK(float_to_bf16(FLT_MAX) == 0x7F80);
  CHECK(float_to_bf16(-inf) == 0xFF80);
  // Signed zeros survive.
  CHECK(float_to_e4m3(-0.0f) == 0x80);
  CHECK(float_to_e5m2(-0.0f) == 0x80);
  CHECK(float_to_f16(-0.0f) == 0x8000);
  CHECK(float_to_bf16(-0.0f) == 0x8000);
  // A NaN whose payload lives only in the low 16 bits must not become an infinity in bf16.
  const uint16_t b = float_to_bf16(std::bit_cast<float>(0x7F800001u));
  CHECK((b & 0x7F80) == 0x7F80);
  CHECK((b & 0x0040) != 0);  // quiet
}

TEST_CASE("bulk conversions match the scalar ones") {
  const size_t n = 100003;  // above the OpenMP threshold, and not a round number
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 300.0f);
  std::vector<float> in(n);
  for (float& v : in) v = normal(rng);
  in[5] = std::numeric_limits<float>::quiet_NaN();
  in[6] = std::numeric_limits<float>::infinity();
  in[7] = 1e-10f;

  SECTION("narrow formats") {
    std::vector<uint16_t> w(n);
    std::vector<uint8_t> b(n);
    std::vector<float> back(n);
    convert_from_float(w.data(), DType::bf16, in.data(), n);
    for (size_t i = 0; i < n; ++i) REQUIRE(w[i] == float_to_bf16(in[i]));
    convert_to_float(back.data(), w.data(), DType::bf16, n);
    for (size_t i = 0; i < n; ++i) REQUIRE(same_bits(back[i], bf16_to_float(w[i])));

    convert_from_float(w.data(), DType::f16, in.data(), n);
    for (size_t i = 0; i < n; ++i) REQUIRE(w[i] == float_to_f16(in[i]));
    convert_to_float(back.data(), w.data(), DType::f16, n);
    for (size_t i = 0; i < n; ++i) REQUIRE(same_bits(back[i], f16_to_float(w[i])));

    convert_from_float(b.data(), DType::e4m3, in.data(), n);
    for (size_t i = 0; i < n; ++i) REQUIRE(b[i] == float_to_e4m3(in[i]));
    convert_to_float(back.data(), b.data(), DType::e4m3, n);
    for (size_t i = 0; i < n; ++i) REQUIRE(same_bits(back[i], e4m3_to_float(b[i])));

    convert_from_float(b.data(), DType::e5m2, in.data(), n);
    for (size_t i = 0; i < n; ++i) REQUIRE(b[i] == float_to_e5m2(in[i]));
    convert_to_float(back.data(), b.data(), DType::e5m2, n);
    for (size_t i = 0; i < n; ++i) REQUIRE(same_bits(back[i], e5m2_to_float(b[i])));
  }
  SECTION("f32 and f64") {
    std::vector<float> f(n);
    std::vector<double> d(n);
    convert_from_float(f.data(), DType::f32, in.data(), n);
    convert_from_float(d.data(), DType::f64, in.data(), n);
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(same_bits(f[i], in[i]));
      REQUIRE(same_bits(static_cast<float>(d[i]), in[i]));
    }
    std::vector<float> back(n);
    convert_to_float(back.data(), d.data(), DType::f64, n);
    for (size_t i = 0; i < n; ++i) REQUIRE(same_bits(back[i], in[i]));
    convert_to_float(back.data(), f.data(), DType::f32, n);
    for (size_t i = 0; i < n; ++i) REQUIRE(same_bits(back[i], in[i]));
  }
  SECTION("integer types are refused") {
    std::vector<int32_t> ints(4);
    float out[4];
    REQUIRE_THROWS_AS(convert_to_float(out, ints.data(), DType::i32, 4), frugal::Error);
    REQUIRE_THROWS_AS(convert_from_float(ints.data(), DType::u8, out, 4), frugal::Error);
  }
}
