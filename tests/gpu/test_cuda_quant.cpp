// The CUDA dequantization of NF4 (with double quantization) and HQQ against the CPU's
// nf4_dequantize / hqq_dequantize rounded to bf16: equal bit for bit, on awkward sizes and on an
// output pointer that is not 16-byte aligned.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "core/random.h"
#include "gpu_support.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/quant.h"
#include "quant/hqq.h"
#include "quant/nf4.h"

namespace {

using frugal::test::DeviceBuffer;

using bf16 = __nv_bfloat16;
using FVec = std::vector<float>;

// Gaussian-ish weights (sum of uniforms) with an outlier and an all-zero block.
FVec test_weights(int64_t n, uint64_t seed) {
  FVec w(static_cast<size_t>(n));
  for (auto& x : w) {
    double s = 0;
    for (int k = 0; k < 4; ++k) s += frugal::uniform01(seed) - 0.5;
    x = static_cast<float>(0.03 * s);
  }
  w[std::min<size_t>(w.size() - 1, 70)] = 2.5f;
  std::fill_n(w.begin(), 64, 0.0f);
  return w;
}

size_t bf16_mismatches(const std::vector<uint16_t>& got, const FVec& want) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) bad += got[i] != frugal::float_to_bf16(want[i]);
  return bad;
}

// Awkward shapes: rows of 64 k elements, block counts not multiples of 256 or of the grid.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {1, 64}, {3, 192}, {37, 448}, {11, 4160}, {257, 320}};

}  // namespace

TEST_CASE("cuda nf4_dequantize equals the CPU's, rounded to bf16", "[gpu]") {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (const auto& [rows, cols] : kShapes) {
    const int64_t n = rows * cols;
    const FVec w = test_weights(n, seed++);
    const auto q = frugal::nf4_quantize(w.data(), {rows, cols}, "w");
    const FVec want = [&] {
      FVec out(static_cast<size_t>(n));
      frugal::nf4_dequantize(q, out.data());
      return out;
    }();
    DeviceBuffer<uint8_t> codes(q.codes.data<uint8_t>(), static_cast<size_t>(n / 2));
    DeviceBuffer<uint8_t> absmax_codes(q.absmax_codes.data<uint8_t>(),
                                       static_cast<size_t>(q.absmax_codes.numel()));
    DeviceBuffer<float> scales(q.absmax_scales.data<float>(),
                               static_cast<size_t>(q.absmax_scales.numel()));
    for (size_t offset : {0, 1}) {
      INFO("shape [" << rows << ", " << cols << "], output offset " << offset);
      DeviceBuffer<bf16> out(static_cast<size_t>(n), offset);
      frugal::cuda::nf4_dequantize(out.get(), codes.get(), absmax_codes.get(), scales.get(),
                                   q.absmax_offset, frugal::nf4_values().data(),
                                   frugal::dynamic_map_values().data(), n, nullptr);
      CHECK(bf16_mismatches(out.download_bits(), want) == 0);
    }
  }
}

TEST_CASE("cuda hqq_dequantize equals the CPU's, rounded to bf16", "[gpu]") {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (const auto& [rows, cols] : kShapes) {
    const int64_t n = rows * cols;
    const FVec w = test_weights(n, seed++);
    const auto q = frugal::hqq_quantize(w.data(), {rows, cols}, "w");
    FVec want(static_cast<size_t>(n));
    frugal::hqq_dequantize(q, want.data());
    DeviceBuffer<uint8_t> codes(q.codes.data<uint8_t>(), static_cast<size_t>(n / 2));
    DeviceBuffer<float> scales(q.scales.data<float>(), static_cast<size_t>(q.groups()));
    DeviceBuffer<float> zeros(q.zeros.data<float>(), static_cast<size_t>(q.groups()));
    for (size_t offset : {0, 1}) {
      INFO("shape [" << rows << ", " << cols << "], output offset " << offset);
      DeviceBuffer<bf16> out(static_cast<size_t>(n), offset);
      frugal::cuda::hqq_dequantize(out.get(), codes.get(), scales.get(), zeros.get(), n, nullptr);
      CHECK(bf16_mismatches(out.download_bits(), want) == 0);
    }
  }
}
