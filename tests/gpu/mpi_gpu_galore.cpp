// GaLore on GPUs against the CPU backend: the fp32 and TF32 matmul (cuBLASLt), GaLore's
// elementwise kernels and its sketch on awkward sizes, and GaloreAdamW on device row shards
// summed over NCCL (1 and 2 ranks) against the CPU optimizer on whole matrices.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "catch_compat.h"
#include "core/random.h"
#include "gpu_support.h"
#include "optim/galore_adamw.h"
#include "train/train_step.h"

using namespace frugal;

namespace {

Tensor random_host(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  uint64_t state = seed;
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = scale * float(2.0 * uniform01(state) - 1.0);
  return t;
}

Tensor to_gpu(const Tensor& host, DeviceContext& gpu) {
  Tensor t = Tensor::empty(host.shape(), host.dtype(), gpu.device_memory());
  ops::copy(t, host);
  return t;
}

double max_difference(const Tensor& a, const Tensor& b) {
  const Tensor ha = ops::to_host_f32(a), hb = ops::to_host_f32(b);
  double worst = 0;
  for (int64_t i = 0; i < ha.numel(); ++i)
    worst = std::max(worst, double(std::abs(ha.data<float>()[i] - hb.data<float>()[i])));
  return worst;
}

}  // namespace

TEST_CASE("cuda matmul and GaLore's kernels against the CPU", "[gpu][galore]") {
  const auto world = test::make_gpu_world();
  if (!world) return;
  DeviceContext& gpu = *world->gpu;
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{37, 23, 19},
                                {301, 129, 67},
                                {5, 1000, 3},
                                {0, 7, 5},
                                {6, 7, 0}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        INFO("m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb);
        const Tensor a = random_host(ta ? Shape{k, m} : Shape{m, k}, 1);
        const Tensor b = random_host(tb ? Shape{n, k} : Shape{k, n}, 2);
        Tensor c = random_host({m, n}, 3);
        Tensor c_gpu = to_gpu(c, gpu);
        ops::matmul(c, a, ta, b, tb, 0.5f, 0.25f);
        ops::matmul(c_gpu, to_gpu(a, gpu), ta, to_gpu(b, gpu), tb, 0.5f, 0.25f);
        CHECK(max_difference(c, c_gpu) < 1e-5 * double(std::max<int64_t>(k, 1)));
      }

  // TF32: each operand rounded to 10 mantissa bits (a relative error of at most 2^-11 each),
  // the sums in fp32: |error| <= k * 2 * 2^-11 * |alpha| with entries in [-1, 1]; and it is not
  // the fp32 product (a test that TF32 is on).
  {
    const int64_t m = 301, n = 129, k = 517;
    const Tensor a = random_host({m, k}, 21), b = random_host({n, k}, 22);
    Tensor c = Tensor::zeros({m, n});
    Tensor c_tf32 = ops::zeros({m, n}, DType::f32, gpu.device_memory());
    Tensor c_fp32 = ops::zeros({m, n}, DType::f32, gpu.device_memory());
    ops::matmul(c, a, false, b, true, 0.5f);
    ops::matmul(c_tf32, to_gpu(a, gpu), false, to_gpu(b, gpu), true, 0.5f, 0.0f,
                ops::MatmulPrecision::tf32);
    ops::matmul(c_fp32, to_gpu(a, gpu), false, to_gpu(b, gpu), true, 0.5f, 0.0f,
                ops::MatmulPrecision::fp32);
    const double tf32_error = max_difference(c, c_tf32), fp32_error = max_difference(c, c_fp32);
    INFO("TF32 off by " << tf32_error << ", fp32 by " << fp32_error);
    CHECK(tf32_error < double(k) * 2.0 * std::ldexp(1.0, -11) * 0.5);
    CHECK(tf32_error > 10 * fp32_error);
  }

  // bf16 operands: the same exact products on both devices, summed in fp32 in another order.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t m = 301, n = 129, k = 517;
      const Tensor a =
          ops::convert(random_host(ta ? Shape{k, m} : Shape{m, k}, 23), DType::bf16, host_arena());
      const Tensor b =
          ops::convert(random_host(tb ? Shape{n, k} : Shape{k, n}, 24), DType::bf16, host_arena());
      Tensor c = random_host({m, n}, 25);
      Tensor c_gpu = to_gpu(c, gpu);
      ops::matmul(c, a, ta, b, tb, 0.5f, 0.25f);
      ops::matmul(c_gpu, to_gpu(a, gpu), ta, to_gpu(b, gpu), tb, 0.5f, 0.25f);
      INFO("bf16 ta " << ta << " tb " << tb);
      CHECK(max_difference(c, c_gpu) < 1e-5 * double(k));
    }

  // The sketch drawn on the device against the CPU twin: the same uniforms (integer
  // arithmetic), CUDA's float64 log and cos against glibc's, both within an ulp of float64, so
  // an entry may differ in its last fp32 bit (2^-23 relative), never more than two.
  {
    const int64_t count = 1031 * 517;
    Tensor host = Tensor::empty({count}, DType::f32);
    Tensor dev = ops::zeros({count}, DType::f32, gpu.device_memory());
    ops::galore_sketch(host, 0x9E3779B97F4A7C15ull);
    ops::galore_sketch(dev, 0x9E3779B97F4A7C15ull);
    const Tensor back = ops::to_host_f32(dev);
    int64_t off = 0, bit_different = 0;
    for (int64_t i = 0; i < count; ++i) {
      const float c = host.data<float>()[i], d = back.data<float>()[i];
      if (c != d) ++bit_different;
      if (std::abs(double(c) - double(d)) > std::ldexp(std::abs(double(c)), -22) + 1e-30) ++off;
    }
    INFO(bit_different << " of " << count << " entries differ in a bit");
    CHECK(off == 0);
    CHECK(bit_different < count / 1000);
  }

  const int64_t n = 100003;
  Tensor m = random_host({n}, 4, 0.1f), v = random_host({n}, 5, 0.01f), r = random_host({n}, 6);
  for (int64_t i = 0; i < n; ++i) v.data<float>()[i] = std::abs(v.data<float>()[i]);
  Tensor gm = to_gpu(m, gpu), gv = to_gpu(v, gpu), gr = to_gpu(r, gpu);
  ops::galore_moments(m, v, r, 0.9f, 0.95f, 1e-8f);
  ops::galore_moments(gm, gv, gr, 0.9f, 0.95f, 1e-8f);
  CHECK(max_difference(m, gm) == 0.0);  // the same roundings, no fused multiply-add
  CHECK(max_difference(v, gv) == 0.0);
  CHECK(max_difference(r, gr) == 0.0);
  Tensor p = random_host({n}, 7), gp = to_gpu(p, gpu);
  const Tensor delta = random_host({n}, 8);
  Tensor copy = Tensor::empty({n}, DType::bf16, gpu.device_memory());
  ops::galore_apply(p, delta, -0.01f, -0.001f);
  ops::galore_apply(gp, to_gpu(delta, gpu), -0.01f, -0.001f, copy);
  CHECK(max_difference(p, gp) == 0.0);
  // The bf16 copy is the updated weight rounded (compared on the GPU: gp equals p).
  CHECK(max_difference(ops::convert(gp, DType::bf16, gpu.device_memory()), copy) == 0.0);
}

TEST_CASE("GaloreAdamW on GPU row shards over NCCL equals the CPU on whole matrices",
          "[gpu][galore]") {
  const auto world = test::make_gpu_world();
  if (!world) return;
  DeviceContext& gpu = *world->gpu;
  const int rank = world->mpi->rank(), ranks = world->mpi->size();
  const std::vector<std::pair<std::string, Shape>> params = {
      {"model.layers.0.self_attn.q_proj.weight", {300, 96}},
      {"model.layers.0.mlp.down_proj.weight", {97, 250}},
      {"model.norm.weight", {96}}};
  const StepCollectives collectives = step_collectives(world->nccl.get(), world->mpi.get());
  // The exact projector with the projections in fp32 and in TF32, the randomized one in fp32
  // (its subspace of these random gradients, whose spectrum has no gap, moves with the TF32
  // rounding of G Omega as much as with another sketch: a CPU comparison would not say much).
  // Each also pipelined (galore.refresh): the device's stages, copies and worker against the
  // CPU's pipelined twin.
  // bf16 projections: the same rounded operands on both devices (the products exact, the sums
  // fp32 in another order), the CPU's range finder in fp32 and the GPU's in TF32 (svd: unused).
  using P = GaloreProjectionPrecision;
  const std::tuple<GaloreProjectorKind, P, GaloreRefresh> cases[] = {
      {GaloreProjectorKind::svd, P::fp32, GaloreRefresh::immediate},
      {GaloreProjectorKind::svd, P::tf32, GaloreRefresh::immediate},
      {GaloreProjectorKind::randomized, P::fp32, GaloreRefresh::immediate},
      {GaloreProjectorKind::svd, P::fp32, GaloreRefresh::pipelined},
      {GaloreProjectorKind::randomized, P::fp32, GaloreRefresh::pipelined},
      {GaloreProjectorKind::svd, P::bf16, GaloreRefresh::pipelined}};
  for (const auto& [kind, precision, refresh] : cases) {
    GaloreConfig g;
    g.projector.kind = kind;
    g.precision = precision;
    g.refresh = refresh;
    g.profile = true;  // timing events between the steps change no result
    g.projector.rank = 16;
    g.update_proj_gap = 2;
    g.moments_on_refresh = MomentsOnRefresh::project;
    std::vector<TrainableShard> cpu, dev;
    for (const auto& [name, shape] : params) {
      const int64_t shard = (shape[0] + ranks - 1) / ranks;
      const int64_t first = std::min(shape[0], rank * shard),
                    last = std::min(shape[0], first + shard);
      TrainableShard c{name, random_host(shape, 11), Tensor::zeros(shape), Tensor(),
                       whole_rows(shape, false)};
      Shape buffer = shape;
      buffer[0] = shard;
      Tensor host_rows = Tensor::zeros(buffer);
      host_rows.rows(0, last - first).copy_from(c.param.rows(first, last));
      TrainableShard d{name, to_gpu(host_rows, gpu),
                       ops::zeros(buffer, DType::f32, gpu.device_memory()), Tensor(),
                       RowShard{shape, first, last}};
      cpu.push_back(c);
      dev.push_back(d);
    }
    GaloreAdamW on_cpu(cpu, AdamWConfig{}, g);
    GaloreAdamW on_gpu(dev, AdamWConfig{}, g, gpu.device_memory());
    for (int64_t step = 1; step <= 5; ++step) {
      for (size_t k = 0; k < params.size(); ++k) {
        const Tensor grad = random_host(params[k].second, 100 + uint64_t(step) * 7 + k);
        cpu[k].grad.copy_from(grad);
        const int64_t first = dev[k].rows.first_row, last = dev[k].rows.last_row;
        Tensor rows = Tensor::zeros(dev[k].grad.shape());
        rows.rows(0, last - first).copy_from(grad.rows(first, last));
        ops::copy(dev[k].grad, rows);
      }
      on_cpu.step(1e-2, step, local_collectives());
      on_gpu.step(1e-2, step, collectives);
    }
    for (size_t k = 0; k < params.size(); ++k) {
      const int64_t first = dev[k].rows.first_row, last = dev[k].rows.last_row;
      const double worst =
          max_difference(cpu[k].param.rows(first, last), dev[k].param.rows(0, last - first));
      INFO(enum_name(kind) << " " << enum_name(precision) << " " << enum_name(refresh) << " "
                           << params[k].first << " on " << ranks << " GPU(s): off by " << worst);
      // Adam's first steps are nearly sign(R): a coordinate of the projected gradient R near zero,
      // rounded differently by cuBLASLt and OpenBLAS, steps the other way. The randomized
      // subspace of these random gradients (no gap in their spectrum) is also less determined
      // than the exact one. On the H200 (2026-12-01) svd stayed below 1e-5 and randomized reached
      // 1.0e-4 on the [97, 250] matrix; the bound below has not run on a GPU yet. TF32 rounds R
      // at 2^-11 instead of 2^-24, so more of its near-zero coordinates flip: its bound, 2e-3, has
      // not run on a GPU yet either. bf16 rounds the same operands alike on both: as fp32, but
      // its coarser R has more coordinates near zero (its bound, 1e-4, has not run on a GPU yet).
      CHECK(worst < (precision == P::tf32               ? 2e-3
                     : precision == P::bf16             ? 1e-4
                     : kind == GaloreProjectorKind::svd ? 1e-5
                                                        : 1e-3));
    }
    // The profile counts the steps and the refreshes (gap 2: steps 1, 3, 5 of 5 refresh each
    // projected matrix), and its times are times.
    const nlohmann::json profile = on_gpu.take_profile();
    CHECK(profile["steps"].get<int64_t>() == 5);
    CHECK(profile["refreshes"].get<int64_t>() == 6);
    for (const char* key : {"refresh_ms", "projection_ms", "moments_ms"})
      CHECK(profile[key].get<double>() > 0);
  }
}
