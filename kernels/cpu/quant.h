// Dequantization of NF4 and HQQ weights on the CPU (the formats of quant/), the twin of
// kernels/cuda/quant.h: one implementation that quant/ and the sharded QLoRA base share.
#pragma once

#include <cstdint>

namespace frugal::cpu {

// out[i] = nf4_table[code_i] * (absmax_map[absmax_codes[b]] * absmax_scales[b / 256] +
// absmax_offset), b = i / 64, with the two roundings bitsandbytes makes. n is a multiple of 64;
// codes holds n / 2 bytes (high nibble first). The tables are quant/nf4.h's nf4_values() (16)
// and dynamic_map_values() (256).
void nf4_dequantize(float* out, const uint8_t* codes, const uint8_t* absmax_codes,
                    const float* absmax_scales, float absmax_offset, const float* nf4_table,
                    const float* absmax_map, int64_t n);

// NF4's first level over `blocks` whole blocks of 64 of w: absmax[b] = max |w| over block b and
// codes[b * 32 ..] its 64 codes (high nibble first), code = the number of the 15 fp32 midpoints
// (quant/nf4.h's nf4_midpoints()) below clamp(w * (1 / max(absmax, 1e-38)), -1, 1), as
// bitsandbytes. Returns the first block holding inf or NaN (its outputs unset), or `blocks`.
int64_t nf4_quantize_blocks(uint8_t* codes, float* absmax, const float* w, int64_t blocks,
                            const float* midpoints);

// out[i] = (code_i - zeros[g]) * scales[g], g = i / 64 (quant/hqq.h's format). n is a multiple
// of 64; codes holds n / 2 bytes (high nibble first).
void hqq_dequantize(float* out, const uint8_t* codes, const float* scales, const float* zeros,
                    int64_t n);

}  // namespace frugal::cpu
