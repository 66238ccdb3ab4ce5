// NF4 and HQQ dequantization, a block (group) of 64 per iteration, OpenMP over blocks.
#include "kernels/cpu/quant.h"

namespace frugal::cpu {

void nf4_dequantize(float* out, const uint8_t* codes, const uint8_t* absmax_codes,
                    const float* absmax_scales, float absmax_offset, const float* nf4_table,
                    const float* absmax_map, int64_t n) {
  constexpr int64_t kBlock = 64, kGroup = 256;
  const int64_t blocks = n / kBlock;
#pragma omp parallel for schedule(static) if (blocks >= 64)
  for (int64_t b = 0; b < blocks; ++b) {
    // Two roundings, as bitsandbytes: dequantize_blockwise, then `absmax += offset`.
    const float centered = absmax_map[absmax_codes[b]] * absmax_scales[b / kGroup];
    const float absmax = centered + absmax_offset;
    const uint8_t* in = codes + b * kBlock / 2;
    float* y = out + b * kBlock;
    for (int64_t i = 0; i < kBlock / 2; ++i) {
      y[2 * i] = nf4_table[in[i] >> 4] * absmax;
      y[2 * i + 1] = nf4_table[in[i] & 0xF] * absmax;
    }
  }
}

void hqq_dequantize(float* out, const uint8_t* codes, const float* scales, const float* zeros,
                    int64_t n) {
  constexpr int64_t kGroup = 64;
  const int64_t groups = n / kGroup;
#pragma omp parallel for schedule(static) if (groups >= 64)
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* in = codes + g * kGroup / 2;
    float* y = out + g * kGroup;
    for (int64_t i = 0; i < kGroup / 2; ++i) {
      y[2 * i] = (static_cast<float>(in[i] >> 4) - zeros[g]) * scales[g];
      y[2 * i + 1] = (static_cast<float>(in[i] & 0xF) - zeros[g]) * scales[g];
    }
  }
}

}  // namespace frugal::cpu
