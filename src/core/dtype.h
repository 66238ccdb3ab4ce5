// Element types and their exact conversions to and from float: bf16 and fp16 round to nearest
// even; fp8 E4M3 (finite, max 448) and E5M2 (max 57344) saturate, per the OCP FP8 spec.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace frugal {

enum class DType : uint8_t { f32, f64, bf16, f16, e4m3, e5m2, u8, i32, i64 };

size_t dtype_bytes(DType t);
std::string dtype_name(DType t);                 // "f32", "bf16", ... (also the names used on disk)
DType dtype_from_name(const std::string& name);  // throws Error naming the unknown dtype

// Raw 16-bit and 8-bit encodings.
// Round to nearest even; NaN stays NaN (sign and top of the payload kept, quiet bit set, so a
// payload only in the low 16 bits cannot become inf); past the largest finite bf16, inf.
// Inline and branch-free so that the loops converting arrays (host AdamW's bf16 copies,
// offload) vectorize: adding 0x7FFF plus the kept part's lowest bit carries into the kept
// bits exactly when round-to-nearest-even rounds up, into the exponent at the top (inf).
inline uint16_t float_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}
float bf16_to_float(uint16_t bits);
uint16_t float_to_f16(float x);  // round to nearest even; overflow -> inf; subnormals kept
float f16_to_float(uint16_t bits);
// FP8: round to nearest even, saturating to +-max (E4M3: 448, E5M2: 57344); NaN -> NaN.
uint8_t float_to_e4m3(float x);
float e4m3_to_float(uint8_t bits);
uint8_t float_to_e5m2(float x);
float e5m2_to_float(uint8_t bits);

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;

// Bulk conversions (OpenMP), used by checkpoints, safetensors and the FP8 path.
void convert_to_float(float* out, const void* in, DType in_type, size_t count);
void convert_from_float(void* out, DType out_type, const float* in, size_t count);

}  // namespace frugal
