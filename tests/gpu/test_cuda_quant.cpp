// The CUDA dequantization of NF4 (with double quantization) and HQQ against the CPU's
// nf4_dequantize / hqq_dequantize rounded to bf16: equal bit for bit, on awkward sizes and on an
// output pointer that is not 16-byte aligned. And the FP8 casts that read a 4-bit weight's codes
// (QLoRA's base straight to E4M3) against the cast of its bf16 dequantization: equal bit for bit.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "core/random.h"
#include "gpu_support.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8.h"
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
      frugal::cuda::nf4_dequantize(
          out.get(),
          {codes.get(), absmax_codes.get(), scales.get(), q.absmax_offset,
           frugal::nf4_values().data(), frugal::dynamic_map_values().data()},
          n, nullptr);
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
      frugal::cuda::hqq_dequantize(out.get(), {codes.get(), scales.get(), zeros.get()}, n, nullptr);
      CHECK(bf16_mismatches(out.download_bits(), want) == 0);
    }
  }
}

namespace {

struct CastResult {
  std::vector<uint8_t> out, out_t;
  std::vector<float> state;  // scale, scale_inv, amax
  std::vector<int64_t> counts;
};

// One E4M3 cast of a [rows, cols] matrix by `launch(out, out_t, state)`: delayed with `scale`,
// or current (the amax pass first, by `amax(amax_pointer)`) with `margin`.
template <class Launch, class Amax>
CastResult cast_with(int64_t rows, int64_t cols, float scale, bool current, int margin,
                     const Launch& launch, const Amax& amax) {
  const size_t n = static_cast<size_t>(rows * cols);
  DeviceBuffer<uint8_t> out(n), out_t(n);
  const std::vector<float> state_host = {scale, 1.0f / scale, 0.0f};
  DeviceBuffer<float> state(state_host.data(), 3);
  DeviceBuffer<int64_t> counts(3);
  if (current) amax(state.get() + 2);
  const frugal::cuda::Fp8CastState s{state.get(),
                                     state.get() + 1,
                                     current ? nullptr : state.get() + 2,
                                     current ? state.get() + 2 : nullptr,
                                     counts.get(),
                                     margin};
  launch(out.get(), out_t.get(), s);
  CUDA_CHECK(cudaDeviceSynchronize());
  return {out.download(), out_t.download(), state.download(), counts.download()};
}

void check_same_cast(const CastResult& direct, const CastResult& two_pass) {
  size_t bad = 0, bad_t = 0;
  for (size_t i = 0; i < direct.out.size(); ++i) {
    bad += direct.out[i] != two_pass.out[i];
    bad_t += direct.out_t[i] != two_pass.out_t[i];
  }
  CHECK(bad == 0);
  CHECK(bad_t == 0);
  for (size_t k = 0; k < 3; ++k) {
    INFO("state " << k);
    CHECK(std::memcmp(&direct.state[k], &two_pass.state[k], sizeof(float)) == 0);
  }
  CHECK(direct.counts == two_pass.counts);
  CHECK(direct.counts[0] == int64_t(direct.out.size()));
}

// Shapes the FP8 GEMMs take, with rows of whole 64-element 4-bit blocks (what NF4 and HQQ
// quantize), row counts off the cast's 64-wide tiles, and block counts that are not multiples
// of 256 (NF4's second level).
const std::vector<std::pair<int64_t, int64_t>> kFp8Shapes = {
    {16, 64}, {48, 320}, {80, 448}, {1040, 576}, {4112, 2112}};

// Delayed scales that flush most values, keep them, and saturate the outlier; current scaling
// with and without a margin.
void check_every_scaling(int64_t rows, int64_t cols, const auto& direct, const auto& direct_amax,
                         const auto& two_pass, const auto& two_pass_amax) {
  for (float scale : {0.01f, 1.0f, 400.0f, 3000.0f}) {
    INFO("delayed, scale " << scale);
    check_same_cast(cast_with(rows, cols, scale, false, 0, direct, direct_amax),
                    cast_with(rows, cols, scale, false, 0, two_pass, two_pass_amax));
  }
  for (int margin : {0, 1}) {
    INFO("current, margin " << margin);
    check_same_cast(cast_with(rows, cols, 1.0f, true, margin, direct, direct_amax),
                    cast_with(rows, cols, 1.0f, true, margin, two_pass, two_pass_amax));
  }
}

}  // namespace

TEST_CASE("cuda fp8 cast of an nf4 weight equals the cast of its bf16 dequantization",
          "[gpu][fp8]") {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (const auto& [rows, cols] : kFp8Shapes) {
    INFO("shape [" << rows << ", " << cols << "]");
    const int64_t n = rows * cols;
    const FVec w = test_weights(n, seed++);
    const auto q = frugal::nf4_quantize(w.data(), {rows, cols}, "w");
    DeviceBuffer<uint8_t> codes(q.codes.data<uint8_t>(), static_cast<size_t>(n / 2));
    DeviceBuffer<uint8_t> absmax_codes(q.absmax_codes.data<uint8_t>(),
                                       static_cast<size_t>(q.absmax_codes.numel()));
    DeviceBuffer<float> scales(q.absmax_scales.data<float>(),
                               static_cast<size_t>(q.absmax_scales.numel()));
    const frugal::cuda::Nf4Device nf4{
        codes.get(),     absmax_codes.get(),          scales.get(),
        q.absmax_offset, frugal::nf4_values().data(), frugal::dynamic_map_values().data()};
    DeviceBuffer<bf16> values(static_cast<size_t>(n));
    frugal::cuda::nf4_dequantize(values.get(), nf4, n, nullptr);
    using frugal::cuda::Fp8CastState;
    const auto fmt = frugal::cpu::Fp8Format::e4m3;
    check_every_scaling(
        rows, cols,
        [&](uint8_t* o, uint8_t* ot, const Fp8CastState& s) {
          frugal::cuda::fp8_cast_transpose(o, ot, nf4, rows, cols, fmt, s, nullptr);
        },
        [&](float* amax) { frugal::cuda::fp8_amax(amax, nf4, n, nullptr); },
        [&](uint8_t* o, uint8_t* ot, const Fp8CastState& s) {
          frugal::cuda::fp8_cast_transpose(o, ot, values.get(), rows, cols, fmt, s, nullptr);
        },
        [&](float* amax) { frugal::cuda::fp8_amax(amax, values.get(), n, nullptr); });
  }
}

TEST_CASE("cuda fp8 cast of an hqq weight equals the cast of its bf16 dequantization",
          "[gpu][fp8]") {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 600;
  for (const auto& [rows, cols] : kFp8Shapes) {
    INFO("shape [" << rows << ", " << cols << "]");
    const int64_t n = rows * cols;
    const FVec w = test_weights(n, seed++);
    const auto q = frugal::hqq_quantize(w.data(), {rows, cols}, "w");
    DeviceBuffer<uint8_t> codes(q.codes.data<uint8_t>(), static_cast<size_t>(n / 2));
    DeviceBuffer<float> scales(q.scales.data<float>(), static_cast<size_t>(q.groups()));
    DeviceBuffer<float> zeros(q.zeros.data<float>(), static_cast<size_t>(q.groups()));
    const frugal::cuda::HqqDevice hqq{codes.get(), scales.get(), zeros.get()};
    DeviceBuffer<bf16> values(static_cast<size_t>(n));
    frugal::cuda::hqq_dequantize(values.get(), hqq, n, nullptr);
    using frugal::cuda::Fp8CastState;
    const auto fmt = frugal::cpu::Fp8Format::e4m3;
    check_every_scaling(
        rows, cols,
        [&](uint8_t* o, uint8_t* ot, const Fp8CastState& s) {
          frugal::cuda::fp8_cast_transpose(o, ot, hqq, rows, cols, fmt, s, nullptr);
        },
        [&](float* amax) { frugal::cuda::fp8_amax(amax, hqq, n, nullptr); },
        [&](uint8_t* o, uint8_t* ot, const Fp8CastState& s) {
          frugal::cuda::fp8_cast_transpose(o, ot, values.get(), rows, cols, fmt, s, nullptr);
        },
        [&](float* amax) { frugal::cuda::fp8_amax(amax, values.get(), n, nullptr); });
  }
}
