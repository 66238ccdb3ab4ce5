// NF4 as bitsandbytes defines it (QLoRA): 4-bit NormalFloat codes, absmax scaling per block of
// 64, two codes per byte, and double quantization of the absmax values to 8 bits.
//
// Layout (bitsandbytes' quantize_4bit with quant_type='nf4', compress_statistics=True):
//   codes[i / 2]        element i's code; the high nibble holds the even element, the low the odd
//   absmax(b)           = max |w| over block b (elements 64 b .. 64 b + 63 of the flat tensor)
//   absmax_codes[b]     8-bit code of absmax(b) - absmax_offset in bitsandbytes' dynamic map,
//                       scaled by absmax_scales[b / 256] (double quantization, blocks of 256)
//   absmax_offset       the mean of all absmax(b)
// Dequantization: w = nf4_value(code) * (dynamic_map(absmax_code) * absmax_scale + offset).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace frugal {

constexpr int64_t kNf4BlockSize = 64;         // elements per absmax block
constexpr int64_t kNf4AbsmaxBlockSize = 256;  // absmax values per second-level scale

// The 16 NormalFloat values, ascending (bitsandbytes' NF4 table); code 7 is exactly 0.
const std::array<float, 16>& nf4_values();
// bitsandbytes' signed dynamic 8-bit map (create_dynamic_map(signed=True)), ascending; code 127
// is exactly 0 and code 255 is 1.
const std::array<float, 256>& dynamic_map_values();

// The 15 thresholds between neighbouring NF4 values, rounded to fp32 as bitsandbytes computes
// them (the codes count those below a normalized value).
const std::array<float, 15>& nf4_midpoints();

// The NF4 code of a value already divided by its block's absmax: the count of midpoints between
// neighbouring table values (rounded to fp32) that lie strictly below x, i.e. the nearest table
// value with an exact tie going to the lower code (bitsandbytes' bucketize / CUDA decision tree).
uint8_t nf4_code(float x);
// The dynamic-map code of x in [-1, 1]: the nearest map value, an exact tie (in fp32 distance)
// going to the lower code, as bitsandbytes' CPU quantize_block.
uint8_t dynamic_map_code(float x);

// One NF4-quantized matrix: what a rank keeps of a frozen base weight.
struct Nf4Weight {
  Shape shape;           // the original shape; the last axis (a row) is a multiple of 64
  Tensor codes;          // u8 [numel / 2]
  Tensor absmax_codes;   // u8 [numel / 64]
  Tensor absmax_scales;  // f32 [ceil(numel / 64 / 256)]
  float absmax_offset = 0.0f;

  int64_t numel() const { return shape_numel(shape); }
  int64_t blocks() const { return numel() / kNf4BlockSize; }
};

// Quantizes w (f32, contiguous). `name` names the tensor in errors. Fails when a row's length
// (the last axis; the whole tensor if 1-D) is not a multiple of 64: rows must split into whole
// blocks so that ZeRO-3's row shards own whole blocks and their absmax values. Fails on inf or
// NaN, naming the tensor and the block. An all-zero block gets absmax 0 and code 7 (0.0)
// everywhere, so it dequantizes to exactly 0.
Nf4Weight nf4_quantize(const Tensor& w, const std::string& name);
Nf4Weight nf4_quantize(const float* w, const Shape& shape, const std::string& name);

// The two levels of nf4_quantize apart, for a weight whose rows are split over ranks (ZeRO-3):
// the first is local to whole blocks; the second needs the absmax of every block of the tensor.
// First level: codes[blocks * 32] and absmax[blocks] of `blocks` whole blocks of w (rows of
// row_len elements, for the message about a non-finite value).
void nf4_quantize_blocks(const float* w, int64_t blocks, int64_t row_len, uint8_t* codes,
                         float* absmax, const std::string& name);
// The error nf4_quantize_blocks throws for a non-finite value in block bad_block (naming the
// tensor, the row and the columns), for a first level computed elsewhere (ops::nf4_first_level).
[[noreturn]] void fail_nf4_non_finite(const std::string& name, int64_t bad_block, int64_t row_len);
// Second level over the absmax of every block: absmax_codes[blocks],
// scales[ceil(blocks / 256)] and the offset (their mean).
void nf4_double_quantize(const float* absmax, int64_t blocks, uint8_t* absmax_codes, float* scales,
                         float* offset);

// The per-block absmax as dequantization sees it (after double quantization): out[blocks()].
void nf4_dequantize_absmax(const Nf4Weight& q, float* out);
// out[numel()] = the dequantized weight, fp32 (OpenMP).
void nf4_dequantize(const Nf4Weight& q, float* out);
Tensor nf4_dequantize(const Nf4Weight& q);

}  // namespace frugal
