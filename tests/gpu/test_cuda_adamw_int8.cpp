// The fused 8-bit AdamW kernels (kernels/cuda/adamw_int8.cu) against the CPU twin
// (kernels/cpu/adamw_int8.cpp), bit for bit: codes, absmax, weights, bf16 copies and GaLore's
// normalized steps. Bit equality is expected, not a tolerance: both evaluate
// kernels/blockwise_int8.h's element math as single IEEE-rounded operations (the GPU through
// __fmul_rn / __fadd_rn / __fdiv_rn / __fsqrt_rn, which nvcc never contracts; the CPU built
// with -ffp-contract=off), their scalars come from one host function, the code maps from one
// table, and a block's absmax is a maximum, which no order of reduction changes. Layouts with
// rows shorter and longer than a block, a last block of a row cut short, blocks of 64, 256 and
// 2048, outliers, and zero blocks.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "gpu_support.h"
#include "kernels/cpu/adamw_int8.h"
#include "kernels/cuda/adamw_int8.h"

namespace {

using frugal::test::DeviceBuffer;
using namespace frugal;

struct Layouts {
  int64_t rows, cols, block;
};
const Layouts kLayouts[] = {{3, 300, 256}, {5, 256, 256},  {2, 4100, 2048},
                            {7, 96, 64},   {1, 5000, 256}, {4, 40, 256}};

std::vector<float> random_values(int64_t n, uint32_t seed, float scale, bool outliers) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  if (outliers)
    for (int64_t i = 0; i < n; i += 97) x[size_t(i)] *= 1000.0f;
  return x;
}

template <class T>
void require_equal_bits(const std::vector<T>& a, const std::vector<T>& b, const char* what) {
  REQUIRE(a.size() == b.size());
  int64_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  INFO(what << ": " << differing << " of " << a.size() << " differ");
  CHECK(differing == 0);
}

cpu::AdamWStep step_of(int64_t t) {
  cpu::AdamWStep s;
  s.lr = 2e-3f;
  s.beta1 = 0.9f;
  s.beta2 = 0.999f;
  s.eps = 1e-8f;
  s.weight_decay = 0.05f;
  s.step = t;
  s.grad_scale = 0.75f;
  return s;
}

}  // namespace

TEST_CASE("CUDA 8-bit AdamW equals the CPU twin bit for bit (f32 master, bf16 copy)",
          "[gpu][adamw8bit]") {
  SKIP_WITHOUT_GPU();
  for (const Layouts& l : kLayouts) {
    INFO(l.rows << " x " << l.cols << " in blocks of " << l.block);
    const cpu::Int8Layout layout{l.rows, l.cols, l.block};
    const int64_t n = l.rows * l.cols, blocks = l.rows * layout.blocks_per_row();
    std::vector<float> w = random_values(n, 1, 0.1f, false);
    std::vector<uint8_t> mc(static_cast<size_t>(n)), vc(static_cast<size_t>(n));
    std::vector<float> ma(static_cast<size_t>(blocks)), va(static_cast<size_t>(blocks));
    std::vector<uint16_t> copy(static_cast<size_t>(n));
    DeviceBuffer<float> dw(w.data(), static_cast<size_t>(n)), dg(static_cast<size_t>(n)),
        dma(static_cast<size_t>(blocks)), dva(static_cast<size_t>(blocks));
    DeviceBuffer<uint8_t> dmc(static_cast<size_t>(n)), dvc(static_cast<size_t>(n));
    DeviceBuffer<__nv_bfloat16> dcopy(static_cast<size_t>(n));
    for (int64_t t = 1; t <= 12; ++t) {
      std::vector<float> g = random_values(n, uint32_t(100 + t), 0.01f, t % 3 == 0);
      if (t == 4)  // a whole row of zero gradient: its blocks decay towards zero
        std::fill(g.begin(), g.begin() + l.cols, 0.0f);
      dg.upload(g);
      cpu::adamw_int8_update(w.data(), g.data(), {mc.data(), ma.data()}, {vc.data(), va.data()},
                             layout, step_of(t), copy.data());
      cuda::adamw_int8_update(dw.get(), dg.get(), {dmc.get(), dma.get()}, {dvc.get(), dva.get()},
                              layout, step_of(t), dcopy.get(), nullptr);
    }
    require_equal_bits(dmc.download(), mc, "first-moment codes");
    require_equal_bits(dvc.download(), vc, "second-moment codes");
    require_equal_bits(dma.download(), ma, "first-moment absmax");
    require_equal_bits(dva.download(), va, "second-moment absmax");
    require_equal_bits(dw.download(), w, "weights");
    require_equal_bits(dcopy.download_bits(), copy, "bf16 copies");
  }
}

TEST_CASE("CUDA 8-bit AdamW equals the CPU twin bit for bit (bf16 master)", "[gpu][adamw8bit]") {
  SKIP_WITHOUT_GPU();
  const cpu::Int8Layout layout{3, 300, 256};
  const int64_t n = 900, blocks = 6;
  std::vector<uint16_t> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  const std::vector<float> w0 = random_values(n, 2, 0.1f, false);
  for (int64_t i = 0; i < n; ++i) w[size_t(i)] = float_to_bf16(w0[size_t(i)]);
  std::vector<uint8_t> mc(static_cast<size_t>(n)), vc(static_cast<size_t>(n));
  std::vector<float> ma(static_cast<size_t>(blocks)), va(static_cast<size_t>(blocks));
  DeviceBuffer<__nv_bfloat16> dw(static_cast<size_t>(n)), dg(static_cast<size_t>(n));
  dw.upload(w);
  DeviceBuffer<float> dma(static_cast<size_t>(blocks)), dva(static_cast<size_t>(blocks));
  DeviceBuffer<uint8_t> dmc(static_cast<size_t>(n)), dvc(static_cast<size_t>(n));
  for (int64_t t = 1; t <= 8; ++t) {
    const std::vector<float> gf = random_values(n, uint32_t(200 + t), 0.01f, t == 5);
    for (int64_t i = 0; i < n; ++i) g[size_t(i)] = float_to_bf16(gf[size_t(i)]);
    dg.upload(g);
    // Stochastic rounding into the bf16 master (optim.bf16_rounding's default), keyed by the
    // step, from element 1000 of a larger parameter: the same bits on both devices.
    Bf16Store store;
    store.stochastic = true;
    store.key = stochastic_rounding_key(7, t, 42);
    store.first_element = 1000;
    cpu::adamw_int8_update(w.data(), g.data(), {mc.data(), ma.data()}, {vc.data(), va.data()},
                           layout, step_of(t), store);
    cuda::adamw_int8_update(dw.get(), dg.get(), {dmc.get(), dma.get()}, {dvc.get(), dva.get()},
                            layout, step_of(t), store, nullptr);
  }
  require_equal_bits(dmc.download(), mc, "first-moment codes");
  require_equal_bits(dvc.download(), vc, "second-moment codes");
  require_equal_bits(dma.download(), ma, "first-moment absmax");
  require_equal_bits(dw.download_bits(), w, "bf16 weights");
}

TEST_CASE("CUDA GaLore 8-bit moments and (de)quantization equal the CPU twin", "[gpu][adamw8bit]") {
  SKIP_WITHOUT_GPU();
  for (const Layouts& l : kLayouts) {
    INFO(l.rows << " x " << l.cols << " in blocks of " << l.block);
    const cpu::Int8Layout layout{l.rows, l.cols, l.block};
    const int64_t n = l.rows * l.cols, blocks = l.rows * layout.blocks_per_row();
    std::vector<uint8_t> mc(static_cast<size_t>(n)), vc(static_cast<size_t>(n));
    std::vector<float> ma(static_cast<size_t>(blocks)), va(static_cast<size_t>(blocks));
    DeviceBuffer<float> dr(static_cast<size_t>(n)), dma(static_cast<size_t>(blocks)),
        dva(static_cast<size_t>(blocks));
    DeviceBuffer<uint8_t> dmc(static_cast<size_t>(n)), dvc(static_cast<size_t>(n));
    std::vector<float> r;
    for (int64_t t = 1; t <= 6; ++t) {
      r = random_values(n, uint32_t(300 + t), 0.5f, t == 2);
      dr.upload(r);
      cpu::galore_moments_int8({mc.data(), ma.data()}, {vc.data(), va.data()}, r.data(), layout,
                               0.9f, 0.95f, 1e-6f);
      cuda::galore_moments_int8({dmc.get(), dma.get()}, {dvc.get(), dva.get()}, dr.get(), layout,
                                0.9f, 0.95f, 1e-6f, nullptr);
    }
    require_equal_bits(dr.download(), r, "normalized steps");
    require_equal_bits(dmc.download(), mc, "first-moment codes");
    require_equal_bits(dva.download(), va, "second-moment absmax");

    for (bool is_signed : {true, false}) {
      std::vector<float> x = random_values(n, 7, 1.0f, true);
      if (!is_signed)
        for (float& v : x) v = std::fabs(v);
      DeviceBuffer<float> dx(x.data(), static_cast<size_t>(n)), dback(static_cast<size_t>(n));
      cpu::quantize_blockwise({mc.data(), ma.data()}, x.data(), layout, is_signed);
      cuda::quantize_blockwise({dmc.get(), dma.get()}, dx.get(), layout, is_signed, nullptr);
      require_equal_bits(dmc.download(), mc, "quantized codes");
      require_equal_bits(dma.download(), ma, "quantized absmax");
      std::vector<float> back(static_cast<size_t>(n));
      cpu::dequantize_blockwise(back.data(), {mc.data(), ma.data()}, layout, is_signed);
      cuda::dequantize_blockwise(dback.get(), {dmc.get(), dma.get()}, layout, is_signed, nullptr);
      require_equal_bits(dback.download(), back, "dequantized values");
    }
  }
}
