// NF4 and HQQ dequantization, a block (group) of 64 per iteration, OpenMP over blocks.
#include "kernels/cpu/quant.h"

#include <algorithm>
#include <cmath>

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

int64_t nf4_quantize_blocks(uint8_t* codes, float* absmax, const float* w, int64_t blocks,
                            const float* midpoints) {
  constexpr int64_t kBlock = 64;
  // The midpoints by value: the count of those below x vectorizes without branches.
  float mid[15];
  std::copy(midpoints, midpoints + 15, mid);
  // A non-finite value cannot throw inside the parallel loop; the first bad block is returned.
  int64_t bad_block = blocks;
#pragma omp parallel for schedule(static) reduction(min : bad_block) if (blocks >= 64)
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = w + b * kBlock;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kBlock; ++i) {
      finite = finite && std::isfinite(x[i]);
      amax = std::max(amax, std::fabs(x[i]));
    }
    if (!finite) {
      bad_block = std::min(bad_block, b);
      continue;
    }
    absmax[b] = amax;
    // bitsandbytes clamps the divisor to 1e-38: an all-zero block normalizes to 0, code 7.
    const float inv = 1.0f / std::max(amax, 1e-38f);
    uint8_t* out = codes + b * kBlock / 2;
    for (int64_t i = 0; i < kBlock; i += 2) {
      const float even = std::clamp(x[i] * inv, -1.0f, 1.0f);
      const float odd = std::clamp(x[i + 1] * inv, -1.0f, 1.0f);
      int hi = 0, lo = 0;
      for (float m : mid) {
        hi += m < even;
        lo += m < odd;
      }
      out[i / 2] = static_cast<uint8_t>(hi << 4 | lo);
    }
  }
  return bad_block;
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
