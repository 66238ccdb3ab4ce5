// The CUDA FP8 kernels against their CPU twins and float64: the fused cast + transpose + amax
// bit for bit against cpu::fp8_cast_transpose (every code of E4M3 and E5M2 as input, random data
// with subnormals and saturation, delayed and current scaling, awkward sizes that are multiples
// of 16 but not of the 64-wide tile); the delayed update kernel against the CPU's; the cuBLASLt
// FP8 GEMMs (forward E4M3 x E4M3 with fast accumulation, dgrad E5M2 x E4M3 and wgrad accumulated
// in fp32 without) against float64 products of the decoded operands, within fp32/bf16 rounding,
// and against the unquantized product within the formats' error bound.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "core/random.h"
#include "gpu_support.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm.h"

namespace {

using frugal::cpu::Fp8Format;
using frugal::test::DeviceBuffer;
using bf16 = __nv_bfloat16;

// bf16 bits of values spread over many binades (normal, subnormal after scaling, past max).
std::vector<uint16_t> spread_bf16(int64_t n, uint64_t seed) {
  std::vector<uint16_t> x(static_cast<size_t>(n));
  for (auto& v : x) {
    const double u = frugal::uniform01(seed);
    const double mag =
        std::ldexp(1.0 + frugal::uniform01(seed), int(frugal::uniform01(seed) * 52) - 34);
    v = frugal::float_to_bf16(float(u < 0.5 ? mag : -mag));
    if (u > 0.97) v = 0;
  }
  return x;
}

std::vector<float> widen(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = frugal::bf16_to_float(b[i]);
  return f;
}

struct GpuCast {
  std::vector<uint8_t> out, out_t;
  float amax, scale, scale_inv;
  std::vector<int64_t> counts;
};

// One cast on the GPU. current: the scale from the amax pass (previous scale 1).
// plain / transposed: which outputs the cast writes (an absent one comes back as zeros).
GpuCast gpu_cast(const std::vector<uint16_t>& x, int64_t rows, int64_t cols, Fp8Format f,
                 float scale, bool current, int margin, bool plain, bool transposed) {
  DeviceBuffer<uint16_t> xd(x.data(), x.size());
  DeviceBuffer<uint8_t> out(x.size()), out_t(x.size());
  std::vector<float> state_host = {scale, 1.0f / scale, 0.0f};
  DeviceBuffer<float> state(state_host.data(), 3);
  DeviceBuffer<int64_t> counts(3);
  const bf16* xp = reinterpret_cast<const bf16*>(xd.get());
  if (current) frugal::cuda::fp8_amax(state.get() + 2, xp, int64_t(x.size()), nullptr);
  const frugal::cuda::Fp8CastState s{state.get(),
                                     state.get() + 1,
                                     current ? nullptr : state.get() + 2,
                                     current ? state.get() + 2 : nullptr,
                                     counts.get(),
                                     margin};
  CUDA_CHECK(cudaMemset(out.get(), 0, x.size()));
  CUDA_CHECK(cudaMemset(out_t.get(), 0, x.size()));
  frugal::cuda::fp8_cast_transpose(plain ? out.get() : nullptr, transposed ? out_t.get() : nullptr,
                                   xp, rows, cols, f, s, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> st = state.download();
  return {out.download(), out_t.download(), st[2], st[0], st[1], counts.download()};
}

void check_cast(const std::vector<uint16_t>& xb, int64_t rows, int64_t cols, Fp8Format f,
                float scale, bool current, int margin, bool plain = true, bool transposed = true) {
  const std::vector<float> x = widen(xb);
  float want_scale = scale;
  if (current)
    want_scale = frugal::cpu::fp8_scale_from_amax(
        frugal::cpu::fp8_amax(x.data(), int64_t(x.size())), scale, frugal::cpu::fp8_max(f), margin);
  std::vector<uint8_t> out(x.size()), out_t(x.size());
  frugal::cpu::Fp8CastCounts counts;
  const float amax = frugal::cpu::fp8_cast_transpose(x.data(), rows, cols, want_scale, f,
                                                     out.data(), out_t.data(), &counts);
  const GpuCast g = gpu_cast(xb, rows, cols, f, scale, current, margin, plain, transposed);
  INFO("rows " << rows << " cols " << cols << " format " << int(f) << " current " << current
                << " plain " << plain << " transposed " << transposed);
  size_t bad = 0, bad_t = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    bad += g.out[i] != (plain ? out[i] : 0);
    bad_t += g.out_t[i] != (transposed ? out_t[i] : 0);
  }
  CHECK(bad == 0);
  CHECK(bad_t == 0);
  CHECK(std::bit_cast<uint32_t>(g.amax) == std::bit_cast<uint32_t>(amax));
  CHECK(g.scale == want_scale);
  if (current) CHECK(g.scale_inv == 1.0f / want_scale);
  CHECK(g.counts[0] == counts.values);
  CHECK(g.counts[1] == counts.flushed);
  CHECK(g.counts[2] == counts.saturated);
}

}  // namespace

TEST_CASE("cuda fp8 cast: every code of each format, bit for bit with the CPU", "[gpu][fp8]") {
  SKIP_WITHOUT_GPU();
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    // [16, 32]: the 256 codes' values (NaN codes as 0; E5M2's infinities included), then the
    // midpoints between neighbours (the ties of nearest-even) where bf16 holds them.
    std::vector<uint16_t> x;
    for (int c = 0; c < 256; ++c) {
      const float v = frugal::cpu::fp8_decode(uint8_t(c), f);
      x.push_back(frugal::float_to_bf16(std::isnan(v) ? 0.0f : v));
    }
    for (int c = 0; c < 256; ++c) {
      const float a = frugal::cpu::fp8_decode(uint8_t(c), f);
      const float b = frugal::cpu::fp8_decode(uint8_t(c + 1), f);
      const float mid = std::isfinite(a) && std::isfinite(b) ? 0.5f * (a + b) : 1e6f;
      x.push_back(frugal::float_to_bf16(mid));
    }
    for (float scale : {1.0f, 0.5f, 3.0f}) check_cast(x, 16, 32, f, scale, false, 0);
  }
}

TEST_CASE("cuda fp8 cast + transpose + amax: random data, awkward sizes, both recipes",
          "[gpu][fp8]") {
  SKIP_WITHOUT_GPU();
  const std::pair<int64_t, int64_t> shapes[] = {{16, 16},    {16, 48}, {80, 208},
                                                {1040, 272}, {64, 64}, {208, 1056}};
  uint64_t seed = 3;
  for (const auto& [rows, cols] : shapes)
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const std::vector<uint16_t> x = spread_bf16(rows * cols, seed++);
      check_cast(x, rows, cols, f, 0.75f, false, 0);
      check_cast(x, rows, cols, f, 3072.0f, false, 0);
      check_cast(x, rows, cols, f, 1.0f, true, 0);
      check_cast(x, rows, cols, f, 1.0f, true, 2);
    }
}

// A matrix of thousands of tiles (the last row and column of tiles partial), with one output
// or both, as training asks for them: the amax and counts are still every value's.
TEST_CASE("cuda fp8 cast: a large matrix, one output or both", "[gpu][fp8]") {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 4112, cols = 2080;  // 65 x 33 tiles of 64, the last row and column partial
  const std::vector<uint16_t> x = spread_bf16(rows * cols, 77);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    check_cast(x, rows, cols, f, 0.75f, false, 0, true, false);
    check_cast(x, rows, cols, f, 0.75f, false, 0, false, true);
    check_cast(x, rows, cols, f, 1.0f, true, 1, true, true);
  }
}

TEST_CASE("cuda fp8 delayed update equals the CPU's", "[gpu][fp8]") {
  SKIP_WITHOUT_GPU();
  const int64_t len = 5, slots = 301;
  std::vector<float> history(static_cast<size_t>(len * slots)), scale(static_cast<size_t>(slots)),
      scale_inv(static_cast<size_t>(slots)), max_values(static_cast<size_t>(slots));
  uint64_t seed = 9;
  for (auto& h : history)
    h = float(std::ldexp(frugal::uniform01(seed), int(frugal::uniform01(seed) * 20) - 10));
  for (int64_t s = 0; s < slots; ++s) {
    scale[size_t(s)] = float(1 + s);
    max_values[size_t(s)] = s % 3 ? 448.0f : 57344.0f;
    if (s % 7 == 0)
      for (int64_t i = 0; i < len; ++i) history[size_t(i * slots + s)] = 0;
    if (s % 11 == 0) history[size_t(2 * slots + s)] = INFINITY;
    if (s % 13 == 0) history[size_t(s)] = NAN;
  }
  DeviceBuffer<float> hd(history.data(), history.size()), sd(scale.data(), scale.size()),
      sid(scale_inv.size()), md(max_values.data(), max_values.size());
  frugal::cuda::fp8_delayed_update(hd.get(), sd.get(), sid.get(), md.get(), len, slots, 1, nullptr);
  frugal::cpu::fp8_delayed_update(history.data(), scale.data(), scale_inv.data(), max_values.data(),
                                  len, slots, 1);
  const std::vector<float> gh = hd.download(), gs = sd.download(), gsi = sid.download();
  for (size_t i = 0; i < history.size(); ++i)
    CHECK(std::bit_cast<uint32_t>(gh[i]) == std::bit_cast<uint32_t>(history[i]));
  for (size_t s = 0; s < size_t(slots); ++s) {
    CHECK(gs[s] == scale[s]);
    CHECK(gsi[s] == scale_inv[s]);
  }
}

namespace {

// Random values of a given size, cast on the CPU with a current scale: the codes, the inverse
// scale, the decoded values (float64) and the originals.
struct Operand {
  std::vector<uint8_t> codes;
  float scale_inv;
  std::vector<double> decoded, original;
};

Operand make_operand(int64_t n, double size, Fp8Format f, uint64_t seed) {
  Operand o;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = float((2 * frugal::uniform01(seed) - 1) * size);
  const float scale = frugal::cpu::fp8_max(f) / frugal::cpu::fp8_amax(x.data(), n);
  o.scale_inv = 1.0f / scale;
  o.codes.resize(x.size());
  frugal::cpu::fp8_cast_transpose(x.data(), 1, n, scale, f, o.codes.data(), nullptr, nullptr);
  for (size_t i = 0; i < x.size(); ++i) {
    o.decoded.push_back(double(frugal::cpu::fp8_decode(o.codes[i], f)) * double(o.scale_inv));
    o.original.push_back(x[i]);
  }
  return o;
}

}  // namespace

TEST_CASE("cuda fp8 GEMMs against float64 within the formats' bounds", "[gpu][fp8][gemm]") {
  SKIP_WITHOUT_GPU();
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  if (major * 10 + minor < 89) {
    std::printf("FP8 GEMMs need sm_89+: skipping\n");
    return;
  }
  frugal::cuda::GemmContext ctx;
  struct Case {
    int64_t m, n, k;
    Fp8Format a, b;
    bool fast, accumulate;
  };
  const Case cases[] = {{208, 96, 336, Fp8Format::e4m3, Fp8Format::e4m3, true, false},    // forward
                        {80, 336, 96, Fp8Format::e5m2, Fp8Format::e4m3, false, false},    // dgrad
                        {96, 336, 1040, Fp8Format::e5m2, Fp8Format::e4m3, false, true}};  // wgrad
  uint64_t seed = 21;
  for (const Case& c : cases) {
    const Operand a = make_operand(c.m * c.k, 2.0, c.a, seed++);
    const Operand b = make_operand(c.n * c.k, 0.05, c.b, seed++);
    std::vector<float> start(size_t(c.m * c.n), 0.0f);
    for (size_t i = 0; i < start.size(); ++i) start[i] = c.accumulate ? float(i % 5) * 0.25f : 0.0f;
    DeviceBuffer<uint8_t> ad(a.codes.data(), a.codes.size()), bd(b.codes.data(), b.codes.size());
    DeviceBuffer<float> sa(&a.scale_inv, 1), sb(&b.scale_inv, 1);
    DeviceBuffer<float> out32(start.data(), start.size());
    DeviceBuffer<uint16_t> out16(start.size());
    frugal::cuda::fp8_gemm_tn(ctx, c.accumulate ? static_cast<void*>(out32.get()) : out16.get(),
                              c.accumulate ? CUDA_R_32F : CUDA_R_16BF, ad.get(),
                              c.a == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2, sa.get(),
                              bd.get(), c.b == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2,
                              sb.get(), c.m, c.n, c.k, c.accumulate, c.fast, nullptr);
    std::vector<double> got(start.size());
    if (c.accumulate) {
      const std::vector<float> g = out32.download();
      std::copy(g.begin(), g.end(), got.begin());
    } else {
      const std::vector<uint16_t> g = out16.download();
      for (size_t i = 0; i < g.size(); ++i) got[i] = frugal::bf16_to_float(g[i]);
    }
    double worst_decoded = 0, worst_original = 0;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double want = start[size_t(i * c.n + j)], exact = want, size = 0;
        for (int64_t k = 0; k < c.k; ++k) {
          want += a.decoded[size_t(i * c.k + k)] * b.decoded[size_t(j * c.k + k)];
          exact += a.original[size_t(i * c.k + k)] * b.original[size_t(j * c.k + k)];
          size += std::fabs(a.original[size_t(i * c.k + k)] * b.original[size_t(j * c.k + k)]);
        }
        const double g = got[size_t(i * c.n + j)];
        // bf16 output: half an ulp of the result (2^-9 relative) on top of the accumulation.
        const double out_rounding = c.accumulate ? 0.0 : std::ldexp(std::fabs(want), -8);
        worst_decoded = std::max(worst_decoded, (std::fabs(g - want) - out_rounding) / size);
        worst_original = std::max(worst_original, (std::fabs(g - exact) - out_rounding) / size);
      }
    INFO("m " << c.m << " n " << c.n << " k " << c.k << " fast " << c.fast);
    // Accumulation error of the decoded operands' exact products. Hopper's FP8 tensor cores keep
    // about 14 bits of the running sum between promotions to fp32 (DeepSeek-V3's measurement), in
    // both modes (without fast accumulation the promotions are more frequent, which matters for
    // long k): the k = 96 dgrad case measured 2.9e-5 of sum |ab| on the H200, where a true fp32
    // accumulation would stay below k * 2^-24 = 5.7e-6. So k * 2^-14 for both.
    CHECK(worst_decoded < double(c.k) * std::ldexp(1.0, -14));
    // Against the unquantized product: each operand's rounding is at most 2^-(mantissa bits + 1)
    // relative (E4M3 2^-4, E5M2 2^-3), so a product's error is below their sum plus its square.
    const double ea = c.a == Fp8Format::e4m3 ? 1.0 / 16 : 1.0 / 8;
    const double eb = c.b == Fp8Format::e4m3 ? 1.0 / 16 : 1.0 / 8;
    CHECK(worst_original < ea + eb + ea * eb + std::ldexp(1.0, -12));
  }
}

TEST_CASE("cuda fp8 dequantize equals the CPU's, rounded to bf16", "[gpu][fp8]") {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1037;  // not a multiple of the block
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      codes[size_t(i)] = uint8_t(i * 37 % 256);
      if (std::isnan(frugal::cpu::fp8_decode(codes[size_t(i)], f))) codes[size_t(i)] = 0x12;
    }
    const float scale_inv = 1.0f / 3.7f;
    std::vector<float> want(codes.size());
    frugal::cpu::fp8_dequantize(want.data(), codes.data(), n, f, scale_inv);
    DeviceBuffer<uint8_t> cd(codes.data(), codes.size());
    DeviceBuffer<float> sd(&scale_inv, 1);
    DeviceBuffer<uint16_t> out(codes.size());
    frugal::cuda::fp8_dequantize(reinterpret_cast<bf16*>(out.get()), cd.get(), n, f, sd.get(),
                                 nullptr);
    const std::vector<uint16_t> got = out.download();
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != frugal::float_to_bf16(want[i]);
    CHECK(bad == 0);
  }
}

TEST_CASE("cuda fp8 code transpose equals the CPU's on awkward sizes", "[gpu][fp8]") {
  SKIP_WITHOUT_GPU();
  // Sizes that are not multiples of the 32 x 32 tile (and one under it), and a tall one.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 45}, {96, 33}, {1000, 80}}) {
    std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
    uint64_t seed = uint64_t(rows * 131 + cols);
    for (auto& c : codes) c = uint8_t(frugal::uniform01(seed) * 256);
    std::vector<uint8_t> want(codes.size());
    frugal::cpu::fp8_transpose_codes(want.data(), codes.data(), rows, cols);
    // The CPU twin is the transpose itself: checked against the index formula too.
    size_t wrong = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        wrong += want[size_t(c * rows + r)] != codes[size_t(r * cols + c)];
    REQUIRE(wrong == 0);
    DeviceBuffer<uint8_t> in(codes.data(), codes.size());
    DeviceBuffer<uint8_t> out(codes.size());
    frugal::cuda::fp8_transpose_codes(out.get(), in.get(), rows, cols, nullptr);
    CHECK(out.download() == want);
  }
}
