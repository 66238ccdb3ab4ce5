// The CUDA updates of bf16 master weights against their CPU twins, bit for bit: AdamW with fp32
// moments (cuda::AdamWChunkBf16Master) and with bf16 moments (cuda::AdamWChunkBf16), and
// GaLore's apply, each rounding stochastically (kernels/stochastic_rounding.h: the same bits
// from each element's index in the whole parameter) and to nearest. Sizes not multiples of the
// vector width, aligned and one element off (the scalar path), and a shard's first element
// other than 0.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "gpu_support.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/galore.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/galore.h"
#include "kernels/stochastic_rounding.h"

using frugal::test::DeviceBuffer;
using bf16 = __nv_bfloat16;

namespace {

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<uint16_t> bits(n);
  for (auto& b : bits) b = frugal::float_to_bf16(dist(rng));
  return bits;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

size_t mismatches(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  size_t wrong = a.size() != b.size();
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) wrong += a[i] != b[i];
  return wrong;
}
size_t mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  size_t wrong = a.size() != b.size();
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) wrong += !(a[i] == b[i]);
  return wrong;
}

}  // namespace

TEST_CASE("cuda bf16 masters: AdamW and GaLore's apply round as the CPU twins, bit for bit",
          "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  const std::vector<size_t> sizes = {1, 37, 4097, 100003, 0, 1025};
  frugal::cuda::AdamWStep step;
  step.lr = 1e-4f;  // steps of a fraction of a bf16 step: where the roundings differ
  step.weight_decay = 0.1f;
  step.grad_scale = 0.5f;
  step.step = 3;
  const uint64_t key = frugal::stochastic_rounding_key(7, 3, frugal::parameter_rounding_id("w", 1));
  for (const bool stochastic : {true, false})
    for (size_t k = 0; k < 2 * sizes.size(); ++k) {
      const size_t n = sizes[k % sizes.size()], offset = k / sizes.size();
      const frugal::Bf16Store store{stochastic, key, static_cast<int64_t>(1000 * k + 13)};
      INFO("n " << n << " offset " << offset << " stochastic " << stochastic);
      const auto p = random_bf16(n, rng, -0.05f, 0.05f), g = random_bf16(n, rng, -0.1f, 0.1f);
      const auto m32 = random_floats(n, rng, -0.01f, 0.01f),
                 v32 = random_floats(n, rng, 0.0f, 0.001f);

      // fp32 moments.
      {
        DeviceBuffer<bf16> dp(n, offset), dg(n, offset);
        DeviceBuffer<float> dm(n), dv(n);
        dp.upload(p);
        dg.upload(g);
        dm.upload(m32);
        dv.upload(v32);
        frugal::cuda::AdamWChunkBf16Master c;
        c.param = dp.get();
        c.grad = dg.get();
        c.m = dm.get();
        c.v = dv.get();
        c.n = static_cast<int64_t>(n);
        c.store = store;
        frugal::cuda::adamw_update(&c, 1, step, nullptr);
        auto wp = p;
        auto wm = m32, wv = v32;
        frugal::cpu::adamw_update_bf16(wp.data(), g.data(), wm.data(), wv.data(),
                                       static_cast<int64_t>(n), step, store);
        CHECK(mismatches(dp.download<uint16_t>(), wp) == 0);
        CHECK(mismatches(dm.download<float>(), wm) == 0);
        CHECK(mismatches(dv.download<float>(), wv) == 0);
        if (stochastic && n > 1000) CHECK(mismatches(wp, p) > 0);  // it moved some weights
      }
      // bf16 moments.
      {
        std::vector<uint16_t> m16(n), v16(n);
        for (size_t i = 0; i < n; ++i) {
          m16[i] = frugal::float_to_bf16(m32[i]);
          v16[i] = frugal::float_to_bf16(v32[i]);
        }
        DeviceBuffer<bf16> dp(n, offset), dg(n, offset), dm(n), dv(n);
        dp.upload(p);
        dg.upload(g);
        dm.upload(m16);
        dv.upload(v16);
        frugal::cuda::AdamWChunkBf16 c;
        c.param = dp.get();
        c.grad = dg.get();
        c.m = dm.get();
        c.v = dv.get();
        c.n = static_cast<int64_t>(n);
        c.store = store;
        frugal::cuda::adamw_update(&c, 1, step, nullptr);
        auto wp = p, wm = m16, wv = v16;
        frugal::cpu::adamw_update_bf16(wp.data(), g.data(), wm.data(), wv.data(),
                                       static_cast<int64_t>(n), step, store);
        CHECK(mismatches(dp.download<uint16_t>(), wp) == 0);
        CHECK(mismatches(dm.download<uint16_t>(), wm) == 0);
        CHECK(mismatches(dv.download<uint16_t>(), wv) == 0);
      }
      // GaLore's apply of a projected-back step.
      {
        const auto delta = random_floats(n, rng, -1.0f, 1.0f);
        DeviceBuffer<bf16> dp(n, offset);
        DeviceBuffer<float> dd(n);
        dp.upload(p);
        dd.upload(delta);
        frugal::cuda::galore_apply(dp.get(), dd.get(), static_cast<int64_t>(n), -1e-4f, -1e-5f,
                                   store, nullptr);
        auto wp = p;
        frugal::cpu::galore_apply_bf16(wp.data(), delta.data(), static_cast<int64_t>(n), -1e-4f,
                                       -1e-5f, store);
        CHECK(mismatches(dp.download<uint16_t>(), wp) == 0);
      }
    }
}
