// Element types: names, sizes, and exact round-to-nearest-even conversions between float and
// the narrow formats (bf16, fp16, FP8 E4M3 and E5M2), one value at a time and in bulk.
#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace frugal {

namespace {

struct DTypeInfo {
  DType type;
  const char* name;
  size_t bytes;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::f32, "f32", 4}, {DType::f64, "f64", 8},   {DType::bf16, "bf16", 2},
    {DType::f16, "f16", 2}, {DType::e4m3, "e4m3", 1}, {DType::e5m2, "e5m2", 1},
    {DType::u8, "u8", 1},   {DType::i32, "i32", 4},   {DType::i64, "i64", 8},
};

const DTypeInfo& info(DType t) {
  for (const DTypeInfo& d : kDTypes)
    if (d.type == t) return d;
  fail("internal check failed: unknown DType value ", static_cast<int>(t));
}

// A narrow binary floating-point format: `mant_bits` stored mantissa bits and an exponent
// with `bias`. Subnormals use the exponent field 0, as in IEEE 754.
struct NarrowFormat {
  int mant_bits;
  int bias;
  uint32_t max_finite_code;  // magnitude bits of the largest finite value
};

constexpr NarrowFormat kBF16 = {7, 127, 0x7F7F};
constexpr NarrowFormat kF16 = {10, 15, 0x7BFF};
constexpr NarrowFormat kE4M3 = {3, 7, 0x7E};
constexpr NarrowFormat kE5M2 = {2, 15, 0x7B};

// Rounds |x| (finite, not NaN) to the nearest value of `fmt`, ties to even mantissa, and returns
// the magnitude bits of that code. The result may exceed fmt.max_finite_code when |x| rounds
// past the largest finite value; callers decide between inf and saturation.
//
// The float's significand `sig` (24 bits with the implicit one) scaled by 2^(e-23) is divided
// by the target's quantum at exponent max(e, emin). The code is then ((e_t + bias - 1) << m) + q:
// for a normal q in [2^m, 2^(m+1)) that is the usual exponent/mantissa packing, a carry out of
// the mantissa (q == 2^(m+1)) bumps the exponent for free, and for e_t == emin a q below 2^m
// is exactly the subnormal code (exponent field 0), rounding up into the smallest normal.
uint32_t round_magnitude(uint32_t float_bits, const NarrowFormat& fmt) {
  const uint32_t abs_bits = float_bits & 0x7FFFFFFFu;
  if (abs_bits == 0) return 0;
  int e;         // unbiased exponent of the float
  uint64_t sig;  // significand as an integer: value = sig * 2^(e - 23)
  const int exp_field = static_cast<int>(abs_bits >> 23);
  if (exp_field == 0) {  // float subnormal
    e = -126;
    sig = abs_bits & 0x7FFFFFu;
  } else {
    e = exp_field - 127;
    sig = (abs_bits & 0x7FFFFFu) | 0x800000u;
  }
  const int emin = 1 - fmt.bias;
  const int e_target = e < emin ? emin : e;
  const int shift = 23 - fmt.mant_bits + (e_target - e);  // >= 16 for every format here
  if (shift > 40) return 0;  // below a quarter of the smallest subnormal: rounds to zero
  uint64_t q = sig >> shift;
  const uint64_t rem = sig & ((uint64_t(1) << shift) - 1);
  const uint64_t half = uint64_t(1) << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;
  const int64_t code = (int64_t(e_target + fmt.bias - 1) << fmt.mant_bits) + int64_t(q);
  // Clamp so huge exponents cannot wrap; anything above max_finite_code means overflow.
  return code > int64_t(0xFFFFFFFF) ? 0xFFFFFFFFu : static_cast<uint32_t>(code);
}

// Value of a narrow code's magnitude bits that are finite (no inf/NaN handling here).
float decode_finite(uint32_t magnitude, const NarrowFormat& fmt) {
  const int exp_field = static_cast<int>(magnitude >> fmt.mant_bits);
  const uint32_t mant = magnitude & ((1u << fmt.mant_bits) - 1);
  if (exp_field == 0)  // subnormal: mant * 2^(emin - m), exact in float
    return std::ldexp(static_cast<float>(mant), 1 - fmt.bias - fmt.mant_bits);
  const uint32_t float_exp = static_cast<uint32_t>(exp_field - fmt.bias + 127);
  const uint32_t bits = (float_exp << 23) | (mant << (23 - fmt.mant_bits));
  return std::bit_cast<float>(bits);
}

float with_sign(float magnitude, bool negative) { return negative ? -magnitude : magnitude; }

// FP8 decoding goes through a 256-entry table built once.
template <class Decode>
std::array<float, 256> make_table(Decode decode) {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) table[code] = decode(static_cast<uint8_t>(code));
  return table;
}

float e4m3_decode_slow(uint8_t bits) {
  const bool negative = bits & 0x80;
  const uint32_t magnitude = bits & 0x7F;
  if (magnitude == 0x7F) return std::numeric_limits<float>::quiet_NaN();  // E4M3FN: only NaN
  return with_sign(decode_finite(magnitude, kE4M3), negative);
}

float e5m2_decode_slow(uint8_t bits) {
  const bool negative = bits & 0x80;
  const uint32_t magnitude = bits & 0x7F;
  if (magnitude == 0x7C) return with_sign(std::numeric_limits<float>::infinity(), negative);
  if (magnitude > 0x7C) return std::numeric_limits<float>::quiet_NaN();
  return with_sign(decode_finite(magnitude, kE5M2), negative);
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = make_table(e4m3_decode_slow);
  return table;
}

const std::array<float, 256>& e5m2_table() {
  static const std::array<float, 256> table = make_table(e5m2_decode_slow);
  return table;
}

// Below this many elements a bulk conversion stays on one thread: waking the team costs more.
constexpr size_t kParallelThreshold = 1 << 15;

template <class In, class Fn>
void map_to_float(float* out, const void* in, size_t count, Fn fn) {
  const In* src = static_cast<const In*>(in);
  const int64_t n = static_cast<int64_t>(count);
#pragma omp parallel for schedule(static) if (count >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = fn(src[i]);
}

template <class Out, class Fn>
void map_from_float(void* out, const float* in, size_t count, Fn fn) {
  Out* dst = static_cast<Out*>(out);
  const int64_t n = static_cast<int64_t>(count);
#pragma omp parallel for schedule(static) if (count >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) dst[i] = fn(in[i]);
}

}  // namespace

size_t dtype_bytes(DType t) { return info(t).bytes; }

std::string dtype_name(DType t) { return info(t).name; }

DType dtype_from_name(const std::string& name) {
  for (const DTypeInfo& d : kDTypes)
    if (name == d.name) return d.type;
  std::string expected;
  for (const DTypeInfo& d : kDTypes) expected += std::string(expected.empty() ? "" : ", ") + d.name;
  fail("unknown dtype '", name, "'; expected one of ", expected);
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }

uint16_t float_to_f16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (bits >> 16) & 0x8000;
  if (std::isnan(x)) return static_cast<uint16_t>(sign | 0x7E00);  // quiet NaN
  if (std::isinf(x)) return static_cast<uint16_t>(sign | 0x7C00);
  const uint32_t magnitude = round_magnitude(bits, kF16);
  return static_cast<uint16_t>(sign | (magnitude > kF16.max_finite_code ? 0x7C00 : magnitude));
}

float f16_to_float(uint16_t bits) {
  const bool negative = bits & 0x8000;
  const uint32_t magnitude = bits & 0x7FFF;
  if (magnitude >= 0x7C00) {
    if (magnitude == 0x7C00) return with_sign(std::numeric_limits<float>::infinity(), negative);
    // NaN: keep sign and payload, quiet bit set.
    return std::bit_cast<float>((uint32_t(bits & 0x8000) << 16) | 0x7FC00000u |
                                ((magnitude & 0x3FF) << 13));
  }
  return with_sign(decode_finite(magnitude, kF16), negative);
}

uint8_t float_to_e4m3(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (bits >> 24) & 0x80;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7F);
  if (std::isinf(x)) return static_cast<uint8_t>(sign | kE4M3.max_finite_code);
  const uint32_t magnitude = round_magnitude(bits, kE4M3);
  return static_cast<uint8_t>(sign | std::min(magnitude, kE4M3.max_finite_code));
}

float e4m3_to_float(uint8_t bits) { return e4m3_table()[bits]; }

uint8_t float_to_e5m2(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (bits >> 24) & 0x80;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7F);
  // Saturating conversion: +-inf becomes +-max too, so an FP8 tensor never holds an infinity.
  if (std::isinf(x)) return static_cast<uint8_t>(sign | kE5M2.max_finite_code);
  const uint32_t magnitude = round_magnitude(bits, kE5M2);
  return static_cast<uint8_t>(sign | std::min(magnitude, kE5M2.max_finite_code));
}

float e5m2_to_float(uint8_t bits) { return e5m2_table()[bits]; }

void convert_to_float(float* out, const void* in, DType in_type, size_t count) {
  switch (in_type) {
    case DType::f32:
      map_to_float<float>(out, in, count, [](float v) { return v; });
      return;
    case DType::f64:
      map_to_float<double>(out, in, count, [](double v) { return static_cast<float>(v); });
      return;
    case DType::bf16:
      map_to_float<uint16_t>(out, in, count, bf16_to_float);
      return;
    case DType::f16:
      map_to_float<uint16_t>(out, in, count, f16_to_float);
      return;
    case DType::e4m3: {
      const std::array<float, 256>& table = e4m3_table();
      map_to_float<uint8_t>(out, in, count, [&table](uint8_t v) { return table[v]; });
      return;
    }
    case DType::e5m2: {
      const std::array<float, 256>& table = e5m2_table();
      map_to_float<uint8_t>(out, in, count, [&table](uint8_t v) { return table[v]; });
      return;
    }
    default:
      fail("convert_to_float: dtype ", dtype_name(in_type), " is not a floating-point type");
  }
}

void convert_from_float(void* out, DType out_type, const float* in, size_t count) {
  switch (out_type) {
    case DType::f32:
      map_from_float<float>(out, in, count, [](float v) { return v; });
      return;
    case DType::f64:
      map_from_float<double>(out, in, count, [](float v) { return static_cast<double>(v); });
      return;
    case DType::bf16:
      map_from_float<uint16_t>(out, in, count, float_to_bf16);
      return;
    case DType::f16:
      map_from_float<uint16_t>(out, in, count, float_to_f16);
      return;
    case DType::e4m3:
      map_from_float<uint8_t>(out, in, count, float_to_e4m3);
      return;
    case DType::e5m2:
      map_from_float<uint8_t>(out, in, count, float_to_e5m2);
      return;
    default:
      fail("convert_from_float: dtype ", dtype_name(out_type), " is not a floating-point type");
  }
}

}  // namespace frugal
