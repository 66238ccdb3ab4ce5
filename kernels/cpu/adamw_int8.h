// The CPU twin of 8-bit AdamW (block-wise quantized moments, kernels/blockwise_int8.h): the
// code maps, the update of a weight and its moments, GaLore's projected moments, and plain
// quantization and dequantization of a moment (checkpoint tools, GaLore's moment rotation).
// A moment of a [rows, cols] tensor is `codes` [rows, cols] (one byte a value) and `absmax`
// [rows, ceil(cols / block)]: its blocks are `block` consecutive values of one row, the last
// block of a row possibly shorter, so that a ZeRO-3 shard (whole rows) holds whole blocks.
#pragma once

#include <array>
#include <cstdint>

#include "kernels/blockwise_int8.h"
#include "kernels/cpu/adamw.h"

namespace frugal::cpu {

// bitsandbytes' create_dynamic_map(signed) (its first moment's map, signed; its second's,
// unsigned): for i = 0..6, the means of consecutive points of linspace(0.1, 1, k_i) times
// 10^(i - 6) (k_i = 2^i + 1 signed, with the negated values too; 2^(i+1) + 1 unsigned), 0 and 1,
// sorted: 256 values in [-1, 1]. Computed in float as torch computes it (linspace's points as a
// fused multiply-add), so that the codes mean the same values as bitsandbytes'.
std::array<float, kInt8Codes> dynamic_code_map(bool is_signed);

// The two maps and their midpoints, made once.
struct Int8CodeMaps {
  float code[2][kInt8Codes];          // [0]: signed, [1]: unsigned
  float midpoint[2][kInt8Codes - 1];  // (code[i] + code[i + 1]) * 0.5f
};
const Int8CodeMaps& int8_code_maps();

struct Int8Moment {
  uint8_t* codes = nullptr;
  float* absmax = nullptr;
};
struct Int8Layout {
  int64_t rows = 0, cols = 0, block = kInt8StateBlock;
  int64_t blocks_per_row() const { return (cols + block - 1) / block; }
};

Int8AdamScalars int8_adam_scalars(const AdamWStep& s);  // checks that s.step >= 1

// One 8-bit AdamW step of an f32 weight [rows, cols] (param_bf16, optional: the bf16 copy of the
// result, written in the same pass, rounded to nearest), or of a bf16 weight with a bf16
// gradient, the result stored as `store` says (optim.bf16_rounding).
void adamw_int8_update(float* param, const float* grad, Int8Moment m, Int8Moment v,
                       const Int8Layout& layout, const AdamWStep& s,
                       uint16_t* param_bf16 = nullptr);
void adamw_int8_update(uint16_t* param, const uint16_t* grad, Int8Moment m, Int8Moment v,
                       const Int8Layout& layout, const AdamWStep& s, const Bf16Store& store);

// GaLore's projected moments in 8 bits: the moments move with r (the projected gradient, f32
// [rows, cols]), and r is replaced by the normalized step m / (sqrt(v) + eps), as
// galore_moments does in f32.
void galore_moments_int8(Int8Moment m, Int8Moment v, float* r, const Int8Layout& layout,
                         float beta1, float beta2, float eps);

// x (f32 [rows, cols]) into codes and absmax (the signed map with the sign rule of the update,
// or the unsigned one), and back.
void quantize_blockwise(Int8Moment q, const float* x, const Int8Layout& layout, bool is_signed);
void dequantize_blockwise(float* x, Int8Moment q, const Int8Layout& layout, bool is_signed);

}  // namespace frugal::cpu
