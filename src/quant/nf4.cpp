// NF4 as bitsandbytes defines it: 4-bit NormalFloat codes with absmax scaling per block of 64 and
// double quantization of the absmax values (8-bit dynamic map, blocks of 256, mean offset).
//
// Matching bitsandbytes bit for bit takes its fp32 arithmetic, not just its formulas: the
// normalized value is w * (1 / absmax) in fp32, NF4 thresholds are the fp32 midpoints of the
// table, the second level divides by its absmax, and the dynamic map is a table (torch's fp32
// linspace makes 72 of its 256 values differ by an ulp from the exact formula).
#include "quant/nf4.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/quant.h"

namespace frugal {

namespace {

constexpr std::array<float, 16> kNf4Values = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// bitsandbytes.functional.create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8),
// as torch computes it in fp32 (printed by tools/make_quant_fixtures.py --print-dynamic-map and
// checked against bitsandbytes' own map by tests/unit/test_quant.cpp).
constexpr std::array<float, 256> kDynamicMap = {
    -0x1.fc6666p-1f,  -0x1.f53334p-1f,  -0x1.eep-1f,      -0x1.e6ccccp-1f,
    -0x1.df999ap-1f,  -0x1.d86666p-1f,  -0x1.d13334p-1f,  -0x1.cap-1f,
    -0x1.c2ccccp-1f,  -0x1.bb999ap-1f,  -0x1.b46666p-1f,  -0x1.ad3334p-1f,
    -0x1.a6p-1f,      -0x1.9eccccp-1f,  -0x1.97999ap-1f,  -0x1.906666p-1f,
    -0x1.893334p-1f,  -0x1.82p-1f,      -0x1.7accccp-1f,  -0x1.73999ap-1f,
    -0x1.6c6668p-1f,  -0x1.653334p-1f,  -0x1.5ep-1f,      -0x1.56ccccp-1f,
    -0x1.4f999ap-1f,  -0x1.486668p-1f,  -0x1.413334p-1f,  -0x1.3ap-1f,
    -0x1.32ccccp-1f,  -0x1.2b999ap-1f,  -0x1.246668p-1f,  -0x1.1d3334p-1f,
    -0x1.16p-1f,      -0x1.0eccccp-1f,  -0x1.079998p-1f,  -0x1.006666p-1f,
    -0x1.f26664p-2f,  -0x1.e4p-2f,      -0x1.d59998p-2f,  -0x1.c73334p-2f,
    -0x1.b8ccccp-2f,  -0x1.aa6666p-2f,  -0x1.9cp-2f,      -0x1.8d9998p-2f,
    -0x1.7f3334p-2f,  -0x1.70ccccp-2f,  -0x1.626666p-2f,  -0x1.54p-2f,
    -0x1.459998p-2f,  -0x1.373334p-2f,  -0x1.28ccccp-2f,  -0x1.1a6668p-2f,
    -0x1.0cp-2f,      -0x1.fb3332p-3f,  -0x1.de6666p-3f,  -0x1.c1999ap-3f,
    -0x1.a4ccccp-3f,  -0x1.88p-3f,      -0x1.6b3334p-3f,  -0x1.4e6666p-3f,
    -0x1.31999ap-3f,  -0x1.14ccccp-3f,  -0x1.fp-4f,       -0x1.b66668p-4f,
    -0x1.93d70ap-4f,  -0x1.8851eep-4f,  -0x1.7ccccep-4f,  -0x1.7147aep-4f,
    -0x1.65c29p-4f,   -0x1.5a3d7p-4f,   -0x1.4eb854p-4f,  -0x1.433334p-4f,
    -0x1.37ae14p-4f,  -0x1.2c28f6p-4f,  -0x1.20a3d6p-4f,  -0x1.151ebap-4f,
    -0x1.09999ap-4f,  -0x1.fc28f6p-5f,  -0x1.e51ebap-5f,  -0x1.ce147ap-5f,
    -0x1.b70a3ep-5f,  -0x1.ap-5f,       -0x1.88f5c2p-5f,  -0x1.71eb86p-5f,
    -0x1.5ae146p-5f,  -0x1.43d70ap-5f,  -0x1.2ccccep-5f,  -0x1.15c29p-5f,
    -0x1.fd70a4p-6f,  -0x1.cf5c2ap-6f,  -0x1.a147aep-6f,  -0x1.733334p-6f,
    -0x1.451ebap-6f,  -0x1.170a3ep-6f,  -0x1.d1eb86p-7f,  -0x1.75c29p-7f,
    -0x1.3e76c8p-7f,  -0x1.2c083p-7f,   -0x1.19999ap-7f,  -0x1.072b02p-7f,
    -0x1.e978d4p-8f,  -0x1.c49ba6p-8f,  -0x1.9fbe76p-8f,  -0x1.7ae148p-8f,
    -0x1.56041ap-8f,  -0x1.3126e8p-8f,  -0x1.0c49bap-8f,  -0x1.ced914p-9f,
    -0x1.851eb8p-9f,  -0x1.3b645ap-9f,  -0x1.e353f8p-10f, -0x1.4fdf3ap-10f,
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f,   -0x1.3dd982p-11f,
    -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f,
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0.0f,
    0x1.27476ep-21f,  0x1.b43528p-19f,  0x1.040bfep-17f,  0x1.64840cp-16f,
    0x1.6f0068p-15f,  0x1.15df66p-14f,  0x1.743e96p-14f,  0x1.47ae16p-13f,
    0x1.19ce0ap-12f,  0x1.8fc506p-12f,  0x1.02de02p-11f,  0x1.3dd982p-11f,
    0x1.78d5p-11f,    0x1.b3d07cp-11f,  0x1.eecbfep-11f,  0x1.4fdf3ap-10f,
    0x1.e353f8p-10f,  0x1.3b645ap-9f,   0x1.851eb8p-9f,   0x1.ced914p-9f,
    0x1.0c49bap-8f,   0x1.3126e8p-8f,   0x1.56041ap-8f,   0x1.7ae148p-8f,
    0x1.9fbe76p-8f,   0x1.c49ba6p-8f,   0x1.e978d4p-8f,   0x1.072b02p-7f,
    0x1.19999ap-7f,   0x1.2c083p-7f,    0x1.3e76c8p-7f,   0x1.75c29p-7f,
    0x1.d1eb86p-7f,   0x1.170a3ep-6f,   0x1.451ebap-6f,   0x1.733334p-6f,
    0x1.a147aep-6f,   0x1.cf5c2ap-6f,   0x1.fd70a4p-6f,   0x1.15c29p-5f,
    0x1.2ccccep-5f,   0x1.43d70ap-5f,   0x1.5ae146p-5f,   0x1.71eb86p-5f,
    0x1.88f5c2p-5f,   0x1.ap-5f,        0x1.b70a3ep-5f,   0x1.ce147ap-5f,
    0x1.e51ebap-5f,   0x1.fc28f6p-5f,   0x1.09999ap-4f,   0x1.151ebap-4f,
    0x1.20a3d6p-4f,   0x1.2c28f6p-4f,   0x1.37ae14p-4f,   0x1.433334p-4f,
    0x1.4eb854p-4f,   0x1.5a3d7p-4f,    0x1.65c29p-4f,    0x1.7147aep-4f,
    0x1.7ccccep-4f,   0x1.8851eep-4f,   0x1.93d70ap-4f,   0x1.b66668p-4f,
    0x1.fp-4f,        0x1.14ccccp-3f,   0x1.31999ap-3f,   0x1.4e6666p-3f,
    0x1.6b3334p-3f,   0x1.88p-3f,       0x1.a4ccccp-3f,   0x1.c1999ap-3f,
    0x1.de6666p-3f,   0x1.fb3332p-3f,   0x1.0cp-2f,       0x1.1a6668p-2f,
    0x1.28ccccp-2f,   0x1.373334p-2f,   0x1.459998p-2f,   0x1.54p-2f,
    0x1.626666p-2f,   0x1.70ccccp-2f,   0x1.7f3334p-2f,   0x1.8d9998p-2f,
    0x1.9cp-2f,       0x1.aa6666p-2f,   0x1.b8ccccp-2f,   0x1.c73334p-2f,
    0x1.d59998p-2f,   0x1.e4p-2f,       0x1.f26664p-2f,   0x1.006666p-1f,
    0x1.079998p-1f,   0x1.0eccccp-1f,   0x1.16p-1f,       0x1.1d3334p-1f,
    0x1.246668p-1f,   0x1.2b999ap-1f,   0x1.32ccccp-1f,   0x1.3ap-1f,
    0x1.413334p-1f,   0x1.486668p-1f,   0x1.4f999ap-1f,   0x1.56ccccp-1f,
    0x1.5ep-1f,       0x1.653334p-1f,   0x1.6c6668p-1f,   0x1.73999ap-1f,
    0x1.7accccp-1f,   0x1.82p-1f,       0x1.893334p-1f,   0x1.906666p-1f,
    0x1.97999ap-1f,   0x1.9eccccp-1f,   0x1.a6p-1f,       0x1.ad3334p-1f,
    0x1.b46666p-1f,   0x1.bb999ap-1f,   0x1.c2ccccp-1f,   0x1.cap-1f,
    0x1.d13334p-1f,   0x1.d86666p-1f,   0x1.df999ap-1f,   0x1.e6ccccp-1f,
    0x1.eep-1f,       0x1.f53334p-1f,   0x1.fc6666p-1f,   0x1p+0f,
};

}  // namespace

const std::array<float, 15>& nf4_midpoints() {
  static const std::array<float, 15> mid = [] {
    std::array<float, 15> m{};
    for (size_t i = 0; i < m.size(); ++i) m[i] = (kNf4Values[i] + kNf4Values[i + 1]) / 2.0f;
    return m;
  }();
  return mid;
}

namespace {

void check_nf4_shape(const Shape& shape, const std::string& name) {
  if (shape.empty()) fail("nf4: tensor '", name, "' is a scalar; NF4 quantizes matrices");
  const int64_t row = shape.back();
  if (row % kNf4BlockSize != 0)
    fail("nf4: tensor '", name, "' of shape ", shape_string(shape), ": rows of ", row,
         " elements are not a multiple of the block size ", kNf4BlockSize,
         " (each row must split into whole blocks so that row shards carry whole blocks)");
}

}  // namespace

const std::array<float, 16>& nf4_values() { return kNf4Values; }
const std::array<float, 256>& dynamic_map_values() { return kDynamicMap; }

namespace {
// The number of midpoints below x: lower_bound's index, without branches (the compiler
// vectorizes it), which makes quantizing a 70B model's random weights several times faster.
inline uint8_t code_of(float x, const std::array<float, 15>& mid) {
  int code = 0;
  for (float m : mid) code += m < x;
  return static_cast<uint8_t>(code);
}
}  // namespace

uint8_t nf4_code(float x) { return code_of(x, nf4_midpoints()); }

uint8_t dynamic_map_code(float x) {
  // Largest i with map[i] <= x (0 below the map), then the nearer of i and i + 1.
  int64_t i = std::upper_bound(kDynamicMap.begin(), kDynamicMap.end(), x) - kDynamicMap.begin() - 1;
  i = std::max<int64_t>(i, 0);
  if (i < 255 && std::fabs(x - kDynamicMap[i + 1]) < std::fabs(x - kDynamicMap[i])) ++i;
  return static_cast<uint8_t>(i);
}

Nf4Weight nf4_quantize(const Tensor& w, const std::string& name) {
  if (w.dtype() != DType::f32)
    fail("nf4: tensor '", name, "' has dtype ", dtype_name(w.dtype()), "; expected f32");
  return nf4_quantize(w.data<float>(), w.shape(), name);
}

void nf4_quantize_blocks(const float* w, int64_t blocks, int64_t row_len, uint8_t* codes,
                         float* absmax, const std::string& name) {
  const int64_t bad_block =
      cpu::nf4_quantize_blocks(codes, absmax, w, blocks, nf4_midpoints().data());
  if (bad_block < blocks) fail_nf4_non_finite(name, bad_block, row_len);
}

void fail_nf4_non_finite(const std::string& name, int64_t bad_block, int64_t row_len) {
  const int64_t row = bad_block * kNf4BlockSize / row_len;
  const int64_t col = bad_block * kNf4BlockSize % row_len;
  fail("nf4: tensor '", name, "' has inf or NaN in block ", bad_block, " (row ", row, ", columns ",
       col, "..", col + kNf4BlockSize - 1, "); refusing to quantize it");
}

void nf4_double_quantize(const float* absmax, int64_t blocks, uint8_t* absmax_codes, float* scales,
                         float* offset) {
  // The absmax values minus their mean, 8-bit per block of 256 with an fp32 scale. torch sums
  // in fp32 in its own order; a double sum rounded once is the exact mean and differs from
  // torch's by an ulp at most.
  double sum = 0.0;
  for (int64_t b = 0; b < blocks; ++b) sum += absmax[b];
  const float mean = blocks > 0 ? static_cast<float>(sum / static_cast<double>(blocks)) : 0.0f;
  *offset = mean;
  const int64_t groups = (blocks + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize;
#pragma omp parallel for schedule(static) if (groups >= 4)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kNf4AbsmaxBlockSize;
    const int64_t end = std::min(blocks, begin + kNf4AbsmaxBlockSize);
    float scale = 0.0f;
    for (int64_t b = begin; b < end; ++b) scale = std::max(scale, std::fabs(absmax[b] - mean));
    scales[g] = scale;
    for (int64_t b = begin; b < end; ++b) {
      // scale 0: every absmax equals the offset; code 127 is the map's exact 0.
      absmax_codes[b] = scale > 0.0f ? dynamic_map_code((absmax[b] - mean) / scale) : uint8_t{127};
    }
  }
}

Nf4Weight nf4_quantize(const float* w, const Shape& shape, const std::string& name) {
  check_nf4_shape(shape, name);
  Nf4Weight q;
  q.shape = shape;
  const int64_t n = q.numel(), blocks = q.blocks();
  const int64_t groups = (blocks + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize;
  q.codes = Tensor::empty({n / 2}, DType::u8);
  q.absmax_codes = Tensor::empty({blocks}, DType::u8);
  q.absmax_scales = Tensor::empty({groups}, DType::f32);
  std::vector<float> absmax(static_cast<size_t>(blocks));
  nf4_quantize_blocks(w, blocks, shape.back(), q.codes.data<uint8_t>(), absmax.data(), name);
  nf4_double_quantize(absmax.data(), blocks, q.absmax_codes.data<uint8_t>(),
                      q.absmax_scales.data<float>(), &q.absmax_offset);
  return q;
}

void nf4_dequantize_absmax(const Nf4Weight& q, float* out) {
  const uint8_t* absmax_codes = q.absmax_codes.data<uint8_t>();
  const float* scales = q.absmax_scales.data<float>();
  const int64_t blocks = q.blocks();
  for (int64_t b = 0; b < blocks; ++b) {
    // Two roundings, as bitsandbytes: dequantize_blockwise, then `absmax += offset`.
    const float centered = kDynamicMap[absmax_codes[b]] * scales[b / kNf4AbsmaxBlockSize];
    out[b] = centered + q.absmax_offset;
  }
}

void nf4_dequantize(const Nf4Weight& q, float* out) {
  cpu::nf4_dequantize(out, q.codes.data<uint8_t>(), q.absmax_codes.data<uint8_t>(),
                      q.absmax_scales.data<float>(), q.absmax_offset, kNf4Values.data(),
                      kDynamicMap.data(), q.numel());
}

Tensor nf4_dequantize(const Nf4Weight& q) {
  Tensor out = Tensor::empty(q.shape, DType::f32);
  nf4_dequantize(q, out.data<float>());
  return out;
}

}  // namespace frugal
