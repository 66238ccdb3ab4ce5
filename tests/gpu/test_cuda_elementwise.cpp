// The CUDA kernels of the elementwise family (embedding, RMSNorm, RoPE, SwiGLU, elementwise,
// AdamW, sum of squares, bf16 conversion) against the CPU kernels on random data of awkward sizes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "gpu_support.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/bias.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"

namespace {

using frugal::test::DeviceBuffer;

using bf16 = __nv_bfloat16;
using FVec = std::vector<float>;

constexpr double kBf16Tol = 1e-2;  // bf16 outputs, relative to max |reference|
constexpr double kFp32Tol = 1e-5;  // fp32 outputs computed in another order
constexpr float kEps = 1e-5f;

// Random values already rounded to bf16: `bits` goes to the GPU, `f` (the same values as float)
// to the CPU kernel.
struct Bf16Data {
  std::vector<uint16_t> bits;
  FVec f;
};

Bf16Data random_bf16(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Bf16Data d{std::vector<uint16_t>(n), FVec(n)};
  for (size_t i = 0; i < n; ++i) {
    d.bits[i] = frugal::float_to_bf16(dist(rng));
    d.f[i] = frugal::bf16_to_float(d.bits[i]);
  }
  return d;
}

FVec random_floats(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  FVec x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

FVec widen(const std::vector<uint16_t>& bits) {
  FVec f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = frugal::bf16_to_float(bits[i]);
  return f;
}

// max |got - want| / max |want| <= tol
void check_close(const FVec& got, const FVec& want, double tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  double max_ref = 0.0, max_err = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (err > max_err || std::isnan(err)) {
      max_err = std::isnan(err) ? INFINITY : err;
      worst = i;
    }
  }
  INFO(what << ": max error " << max_err << " at " << worst << " (got " << got[worst] << ", want "
            << want[worst] << "), max |ref| " << max_ref);
  CHECK(max_err <= tol * std::max(max_ref, 1e-30));
}

// bf16 bits from the GPU against a float reference.
void check_close_bf16(const std::vector<uint16_t>& got, const FVec& want, double tol,
                      const std::string& what) {
  check_close(widen(got), want, tol, what);
}

}  // namespace

TEST_CASE("cuda convert: bf16 <-> f32 match the CPU's rounding exactly", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  for (size_t offset : {0, 1}) {
    for (size_t n : {size_t{1}, size_t{13}, size_t{13 * 4097}}) {
      const FVec x = random_floats(n, rng, -300.0f, 300.0f);
      DeviceBuffer<float> d_f(n, offset);
      DeviceBuffer<bf16> d_b(n, offset);
      d_f.upload(x);
      frugal::cuda::f32_to_bf16(d_b.get(), d_f.get(), static_cast<int64_t>(n), nullptr);
      const auto bits = d_b.download<uint16_t>();
      size_t mismatches = 0;
      for (size_t i = 0; i < n; ++i) mismatches += bits[i] != frugal::float_to_bf16(x[i]);
      INFO("n " << n << " offset " << offset);
      CHECK(mismatches == 0);

      DeviceBuffer<float> d_back(n, 1 - offset);
      frugal::cuda::bf16_to_f32(d_back.get(), d_b.get(), static_cast<int64_t>(n), nullptr);
      CHECK(d_back.download<float>() == widen(bits));
    }
  }
}

TEST_CASE("cuda elementwise: add, scale, add_scaled in fp32 and bf16", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  const float s = 0.37f;
  for (size_t offset : {0, 1}) {
    for (size_t n : {size_t{13}, size_t{13 * 200}, size_t{13 * 4097}}) {
      INFO("n " << n << " offset " << offset);
      const FVec y0 = random_floats(n, rng), x0 = random_floats(n, rng);
      DeviceBuffer<float> dy(n, offset), dx(n, offset);
      dx.upload(x0);

      FVec want = y0;
      dy.upload(y0);
      frugal::cuda::add_inplace(dy.get(), dx.get(), static_cast<int64_t>(n), nullptr);
      frugal::cpu::add_inplace(want.data(), x0.data(), static_cast<int64_t>(n));
      check_close(dy.download<float>(), want, kFp32Tol, "add f32");

      want = y0;
      dy.upload(y0);
      frugal::cuda::scale_inplace(dy.get(), s, static_cast<int64_t>(n), nullptr);
      frugal::cpu::scale_inplace(want.data(), s, static_cast<int64_t>(n));
      check_close(dy.download<float>(), want, kFp32Tol, "scale f32");

      want = y0;
      dy.upload(y0);
      frugal::cuda::add_scaled_inplace(dy.get(), dx.get(), s, static_cast<int64_t>(n), nullptr);
      frugal::cpu::add_scaled_inplace(want.data(), x0.data(), s, static_cast<int64_t>(n));
      check_close(dy.download<float>(), want, kFp32Tol, "add_scaled f32");

      const Bf16Data yb = random_bf16(n, rng), xb = random_bf16(n, rng);
      DeviceBuffer<bf16> by(n, offset), bx(n, offset);
      bx.upload(xb.bits);

      want = yb.f;
      by.upload(yb.bits);
      frugal::cuda::add_inplace(by.get(), bx.get(), static_cast<int64_t>(n), nullptr);
      frugal::cpu::add_inplace(want.data(), xb.f.data(), static_cast<int64_t>(n));
      check_close_bf16(by.download<uint16_t>(), want, kBf16Tol, "add bf16");

      want = yb.f;
      by.upload(yb.bits);
      frugal::cuda::scale_inplace(by.get(), s, static_cast<int64_t>(n), nullptr);
      frugal::cpu::scale_inplace(want.data(), s, static_cast<int64_t>(n));
      check_close_bf16(by.download<uint16_t>(), want, kBf16Tol, "scale bf16");

      want = yb.f;
      by.upload(yb.bits);
      frugal::cuda::add_scaled_inplace(by.get(), bx.get(), s, static_cast<int64_t>(n), nullptr);
      frugal::cpu::add_scaled_inplace(want.data(), xb.f.data(), s, static_cast<int64_t>(n));
      check_close_bf16(by.download<uint16_t>(), want, kBf16Tol, "add_scaled bf16");
    }
  }
}

TEST_CASE("cuda swiglu: forward and backward against the CPU", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  for (size_t offset : {0, 1}) {
    for (size_t n : {size_t{13 * 48}, size_t{13 * 200}, size_t{13 * 4097}}) {
      INFO("n " << n << " offset " << offset);
      const Bf16Data g = random_bf16(n, rng, -6.0f, 6.0f), u = random_bf16(n, rng),
                     dh = random_bf16(n, rng);
      DeviceBuffer<bf16> d_g(n, offset), d_u(n, offset), d_dh(n, offset), d_h(n, offset),
          d_dg(n, offset), d_du(n, offset);
      d_g.upload(g.bits);
      d_u.upload(u.bits);
      d_dh.upload(dh.bits);
      const auto len = static_cast<int64_t>(n);

      frugal::cuda::swiglu_forward(d_h.get(), d_g.get(), d_u.get(), len, nullptr);
      FVec h(n);
      frugal::cpu::swiglu_forward(h.data(), g.f.data(), u.f.data(), len);
      check_close_bf16(d_h.download<uint16_t>(), h, kBf16Tol, "swiglu forward");

      frugal::cuda::swiglu_backward(d_dg.get(), d_du.get(), d_dh.get(), d_g.get(), d_u.get(), len,
                                    nullptr);
      FVec dg(n), du(n);
      frugal::cpu::swiglu_backward(dg.data(), du.data(), dh.f.data(), g.f.data(), u.f.data(), len);
      check_close_bf16(d_dg.download<uint16_t>(), dg, kBf16Tol, "swiglu dg");
      check_close_bf16(d_du.download<uint16_t>(), du, kBf16Tol, "swiglu du");
    }
  }
}

TEST_CASE("cuda rmsnorm: forward, fused residual forward and backward against the CPU", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  for (int64_t rows : {int64_t{13}, int64_t{1037}}) {
    for (int64_t dim : {int64_t{48}, int64_t{200}, int64_t{4097}}) {
      INFO("rows " << rows << " dim " << dim);
      const size_t n = static_cast<size_t>(rows * dim), d = static_cast<size_t>(dim);
      const Bf16Data x = random_bf16(n, rng, -2.0f, 2.0f), r = random_bf16(n, rng, -2.0f, 2.0f),
                     w = random_bf16(d, rng, 0.5f, 1.5f), dy = random_bf16(n, rng),
                     dres = random_bf16(n, rng);
      DeviceBuffer<bf16> d_x(n), d_r(n), d_w(d), d_y(n), d_s(n), d_dy(n), d_dx(n), d_dres(n);
      DeviceBuffer<float> d_rstd(static_cast<size_t>(rows)), d_dw(d);
      d_x.upload(x.bits);
      d_r.upload(r.bits);
      d_w.upload(w.bits);
      d_dy.upload(dy.bits);
      d_dres.upload(dres.bits);

      // Plain forward.
      frugal::cuda::rmsnorm_forward(d_y.get(), d_rstd.get(), d_x.get(), d_w.get(), rows, dim, kEps,
                                    nullptr);
      FVec y(n), rstd(static_cast<size_t>(rows));
      frugal::cpu::rmsnorm_forward(y.data(), rstd.data(), x.f.data(), w.f.data(), rows, dim, kEps);
      check_close_bf16(d_y.download<uint16_t>(), y, kBf16Tol, "rmsnorm y");
      check_close(d_rstd.download<float>(), rstd, kFp32Tol, "rmsnorm rstd");

      // Fused residual: s must be exactly bf16(x + r); y and rstd from that s.
      frugal::cuda::rmsnorm_residual_forward(d_s.get(), d_y.get(), d_rstd.get(), d_x.get(),
                                             d_r.get(), d_w.get(), rows, dim, kEps, nullptr);
      std::vector<uint16_t> s_bits(n);
      FVec s(n);
      for (size_t i = 0; i < n; ++i) {
        s_bits[i] = frugal::float_to_bf16(x.f[i] + r.f[i]);
        s[i] = frugal::bf16_to_float(s_bits[i]);
      }
      CHECK(d_s.download<uint16_t>() == s_bits);
      frugal::cpu::rmsnorm_forward(y.data(), rstd.data(), s.data(), w.f.data(), rows, dim, kEps);
      check_close_bf16(d_y.download<uint16_t>(), y, kBf16Tol, "rmsnorm residual y");
      check_close(d_rstd.download<float>(), rstd, kFp32Tol, "rmsnorm residual rstd");

      // Backward with the CPU's rstd as the saved statistic for both; dw accumulates onto a
      // nonzero start; dx with and without the residual gradient.
      const FVec dw0 = random_floats(d, rng);
      d_rstd.upload(rstd);
      d_dw.upload(dw0);
      DeviceBuffer<float> scratch(
          static_cast<size_t>(frugal::cuda::rmsnorm_backward_scratch_floats(rows, dim)));
      frugal::cuda::rmsnorm_backward(d_dx.get(), d_dw.get(), d_dy.get(), d_s.get(), d_w.get(),
                                     d_rstd.get(), nullptr, rows, dim, scratch.get(), nullptr);
      FVec dx(n), dw = dw0;
      frugal::cpu::rmsnorm_backward(dx.data(), dw.data(), dy.f.data(), s.data(), w.f.data(),
                                    rstd.data(), rows, dim);
      check_close_bf16(d_dx.download<uint16_t>(), dx, kBf16Tol, "rmsnorm dx");
      check_close(d_dw.download<float>(), dw, 1e-4, "rmsnorm dw");

      frugal::cuda::rmsnorm_backward(d_dx.get(), static_cast<float*>(nullptr), d_dy.get(),
                                     d_s.get(), d_w.get(), d_rstd.get(), d_dres.get(), rows, dim,
                                     nullptr, nullptr);
      frugal::cpu::add_inplace(dx.data(), dres.f.data(), static_cast<int64_t>(n));
      check_close_bf16(d_dx.download<uint16_t>(), dx, kBf16Tol, "rmsnorm dx + dresidual");
    }
  }
}

TEST_CASE("cuda rope: forward and backward against the CPU", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> pos_dist(0, 8191);
  const int64_t tokens = 13, heads = 3;
  for (int64_t head_dim : {int64_t{16}, int64_t{128}, int64_t{10}, int64_t{48}}) {
    for (float theta : {10000.0f, 500000.0f}) {
      // The plain table of theta, and the same with linear scaling by 4 and YaRN's factor on
      // cos and sin (the GPU takes any table; the scaled ones come from model/rope_scaling).
      for (float scaling : {1.0f, 1.1386294f}) {
        INFO("head_dim " << head_dim << " theta " << theta << " scaling " << scaling);
        std::vector<float> inv(static_cast<size_t>(head_dim / 2));
        for (int64_t i = 0; i < head_dim / 2; ++i)
          inv[i] = static_cast<float>(1.0 / std::pow(double(theta), 2.0 * i / double(head_dim)) /
                                      (scaling == 1.0f ? 1.0 : 4.0));
        const size_t n = static_cast<size_t>(tokens * heads * head_dim);
        const Bf16Data x = random_bf16(n, rng);
        std::vector<int32_t> pos(static_cast<size_t>(tokens));
        for (auto& p : pos) p = pos_dist(rng);
        pos[0] = 0;
        DeviceBuffer<bf16> d_x(n), d_y(n);
        DeviceBuffer<int32_t> d_pos(pos.size());
        d_pos.upload(pos);
        FVec want_forward = x.f, want_backward = x.f;
        frugal::cpu::rope_forward(want_forward.data(), pos.data(), tokens, heads, head_dim,
                                  inv.data(), scaling);
        frugal::cpu::rope_backward(want_backward.data(), pos.data(), tokens, heads, head_dim,
                                   inv.data(), scaling);

        // Out of place (x left as it was), then in place (y = x).
        d_x.upload(x.bits);
        frugal::cuda::rope_forward(d_y.get(), d_x.get(), d_pos.get(), tokens, heads, head_dim,
                                   inv.data(), scaling, nullptr);
        check_close_bf16(d_y.download<uint16_t>(), want_forward, kBf16Tol, "rope forward");
        CHECK(d_x.download<uint16_t>() == x.bits);
        frugal::cuda::rope_backward(d_y.get(), d_x.get(), d_pos.get(), tokens, heads, head_dim,
                                    inv.data(), scaling, nullptr);
        check_close_bf16(d_y.download<uint16_t>(), want_backward, kBf16Tol, "rope backward");
        CHECK(d_x.download<uint16_t>() == x.bits);

        frugal::cuda::rope_forward(d_x.get(), d_x.get(), d_pos.get(), tokens, heads, head_dim,
                                   inv.data(), scaling, nullptr);
        check_close_bf16(d_x.download<uint16_t>(), want_forward, kBf16Tol, "rope forward in place");
        d_x.upload(x.bits);
        frugal::cuda::rope_backward(d_x.get(), d_x.get(), d_pos.get(), tokens, heads, head_dim,
                                    inv.data(), scaling, nullptr);
        check_close_bf16(d_x.download<uint16_t>(), want_backward, kBf16Tol,
                         "rope backward in place");
      }
    }
  }
}

TEST_CASE("cuda bias: add and gradient against the CPU", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  for (int64_t rows : {int64_t{1}, int64_t{37}, int64_t{1000}}) {
    for (int64_t cols : {int64_t{13}, int64_t{384}, int64_t{300}}) {
      INFO("rows " << rows << " cols " << cols);
      const size_t n = static_cast<size_t>(rows * cols);
      const Bf16Data x = random_bf16(n, rng), b = random_bf16(static_cast<size_t>(cols), rng);
      DeviceBuffer<bf16> d_x(n), d_b(static_cast<size_t>(cols));
      d_x.upload(x.bits);
      d_b.upload(b.bits);
      frugal::cuda::add_bias(d_x.get(), d_b.get(), rows, cols, nullptr);
      FVec want = x.f;
      frugal::cpu::add_bias(want.data(), b.f.data(), rows, cols);
      check_close_bf16(d_x.download<uint16_t>(), want, kBf16Tol, "bias add");

      const Bf16Data dy = random_bf16(n, rng);
      DeviceBuffer<bf16> d_dy(n);
      d_dy.upload(dy.bits);
      std::vector<float> db(static_cast<size_t>(cols), 0.25f);
      DeviceBuffer<float> d_db(db.size());
      d_db.upload(db);
      frugal::cuda::bias_backward(d_db.get(), d_dy.get(), rows, cols, nullptr);
      frugal::cpu::bias_backward(db.data(), dy.f.data(), rows, cols);
      const std::vector<float> got = d_db.download<float>();
      for (int64_t c = 0; c < cols; ++c)  // fp32 sums of exact bf16 values, in row order
        CHECK(got[c] == Approx(db[c]).epsilon(1e-5).margin(1e-4 * std::sqrt(double(rows))));
    }
  }
}

TEST_CASE("cuda embedding: forward copies rows, backward sums in the CPU's order", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  // (vocab, dim): the big vocabulary with row lengths that take the vector path, the small one
  // also with 4097 (the fallback); the big table at dim 4097 would cost GiBs of host memory.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {37, 48}, {37, 200}, {37, 4097}, {32003, 48}, {32003, 200}};
  for (const auto& [vocab, dim] : shapes) {
    for (int64_t n_tokens : {int64_t{13}, int64_t{700}}) {
      INFO("vocab " << vocab << " dim " << dim << " tokens " << n_tokens);
      const size_t nt = static_cast<size_t>(n_tokens), table_n = static_cast<size_t>(vocab * dim);
      std::uniform_int_distribution<int32_t> tok_dist(0, static_cast<int32_t>(vocab - 1));
      std::vector<int32_t> tokens(nt);
      for (auto& t : tokens) t = tok_dist(rng);
      tokens[nt - 1] = tokens[0];  // at least one repeat, even with the big vocabulary
      const Bf16Data table = random_bf16(table_n, rng);
      const Bf16Data dout = random_bf16(nt * static_cast<size_t>(dim), rng);
      const FVec dtable0 = random_floats(table_n, rng);

      DeviceBuffer<int32_t> d_tokens(nt);
      DeviceBuffer<bf16> d_table(table_n), d_out(nt * static_cast<size_t>(dim)),
          d_dout(nt * static_cast<size_t>(dim));
      DeviceBuffer<float> d_dtable(table_n);
      DeviceBuffer<int32_t> scratch(
          static_cast<size_t>(frugal::cuda::embedding_backward_scratch_ints(n_tokens, vocab)));
      d_tokens.upload(tokens);
      d_table.upload(table.bits);
      d_dout.upload(dout.bits);

      frugal::cuda::embedding_forward(d_out.get(), d_tokens.get(), d_table.get(), n_tokens, vocab,
                                      dim, nullptr);
      FVec out(nt * static_cast<size_t>(dim));
      frugal::cpu::embedding_forward(out.data(), tokens.data(), table.f.data(), n_tokens, vocab,
                                     dim);
      CHECK(widen(d_out.download<uint16_t>()) == out);

      d_dtable.upload(dtable0);
      frugal::cuda::embedding_backward(d_dtable.get(), d_dout.get(), d_tokens.get(), n_tokens,
                                       vocab, dim, scratch.get(), nullptr);
      FVec dtable = dtable0;
      frugal::cpu::embedding_backward(dtable.data(), dout.f.data(), tokens.data(), n_tokens, vocab,
                                      dim);
      CHECK(d_dtable.download<float>() == dtable);  // same adds in the same order
    }
  }
}

TEST_CASE("cuda adamw: multi-tensor update matches the CPU, bf16 copy included", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  // More chunks than one launch takes; sizes awkward, some tensors misaligned, some without the
  // bf16 copy, one empty.
  std::vector<size_t> sizes = {1, 37, 4097, 100003, 0, 1024, 1025};
  std::uniform_int_distribution<size_t> small(1, 3000);
  while (sizes.size() < 2 * frugal::cuda::kAdamWChunksPerLaunch + 5) sizes.push_back(small(rng));

  struct Tensor {
    FVec p, g, m, v;
    std::unique_ptr<DeviceBuffer<float>> dp, dg, dm, dv;
    std::unique_ptr<DeviceBuffer<bf16>> dbf;
  };
  std::vector<Tensor> tensors(sizes.size());
  std::vector<frugal::cuda::AdamWChunk> chunks;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t n = sizes[k], offset = k % 3 == 2 ? 1 : 0;
    Tensor& t = tensors[k];
    t.p = random_floats(n, rng);
    t.g = random_floats(n, rng, -0.1f, 0.1f);
    t.m = random_floats(n, rng, -0.01f, 0.01f);
    t.v = random_floats(n, rng, 0.0f, 0.001f);
    t.dp = std::make_unique<DeviceBuffer<float>>(n, offset);
    t.dg = std::make_unique<DeviceBuffer<float>>(n, offset);
    t.dm = std::make_unique<DeviceBuffer<float>>(n, offset);
    t.dv = std::make_unique<DeviceBuffer<float>>(n, offset);
    t.dp->upload(t.p);
    t.dg->upload(t.g);
    t.dm->upload(t.m);
    t.dv->upload(t.v);
    frugal::cuda::AdamWChunk c;
    c.param = t.dp->get();
    c.grad = t.dg->get();
    c.m = t.dm->get();
    c.v = t.dv->get();
    c.n = static_cast<int64_t>(n);
    if (k % 2 == 0) {
      t.dbf = std::make_unique<DeviceBuffer<bf16>>(n, offset);
      c.param_bf16 = t.dbf->get();
    }
    chunks.push_back(c);
  }

  frugal::cuda::AdamWStep step;
  step.lr = 3e-3f;
  step.weight_decay = 0.1f;
  step.grad_scale = 0.5f;
  for (int64_t t = 1; t <= 3; ++t) {
    step.step = t;
    frugal::cuda::adamw_update(chunks.data(), static_cast<int64_t>(chunks.size()), step, nullptr);
    for (auto& tensor : tensors)
      frugal::cpu::adamw_update(tensor.p.data(), tensor.g.data(), tensor.m.data(), tensor.v.data(),
                                static_cast<int64_t>(tensor.p.size()), step);
  }
  for (size_t k = 0; k < tensors.size(); ++k) {
    Tensor& t = tensors[k];
    INFO("chunk " << k << " n " << sizes[k]);
    if (sizes[k] == 0) continue;
    const FVec p = t.dp->download<float>();
    check_close(p, t.p, 1e-6, "adamw param");
    check_close(t.dm->download<float>(), t.m, 1e-6, "adamw m");
    check_close(t.dv->download<float>(), t.v, 1e-6, "adamw v");
    if (t.dbf) {
      const auto bits = t.dbf->download<uint16_t>();
      size_t mismatches = 0;
      for (size_t i = 0; i < bits.size(); ++i) mismatches += bits[i] != frugal::float_to_bf16(p[i]);
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("cuda dropout draws the CPU's mask and scale", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  for (size_t n : {size_t{1}, size_t{13 * 4097}}) {
    INFO("n " << n);
    const Bf16Data x = random_bf16(n, rng);
    DeviceBuffer<bf16> d_x(n), d_y(n);
    d_x.upload(x.bits);
    frugal::cuda::dropout(d_y.get(), d_x.get(), static_cast<int64_t>(n), 0.3f, 1234, 77, nullptr);
    FVec y(n);
    frugal::cpu::dropout(y.data(), x.f.data(), static_cast<int64_t>(n), 0.3f, 1234, 77);
    const std::vector<uint16_t> got = d_y.download<uint16_t>();
    size_t mismatches = 0;
    for (size_t i = 0; i < n; ++i) mismatches += got[i] != frugal::float_to_bf16(y[i]);
    CHECK(mismatches == 0);  // the same mask, and x / (1 - p) rounded once from fp32
  }
}

TEST_CASE("cuda sum_squares: fp64 global norm against the CPU", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  DeviceBuffer<double> out(1), scratch(static_cast<size_t>(frugal::cuda::kSumSquaresScratch));
  double total = 0.0;
  bool accumulate = false;
  for (size_t offset : {0, 1}) {
    for (size_t n : {size_t{1}, size_t{13 * 4097}, size_t{3000017}}) {
      INFO("n " << n << " offset " << offset);
      const FVec x = random_floats(n, rng);
      DeviceBuffer<float> d_x(n, offset);
      d_x.upload(x);
      frugal::cuda::sum_squares(out.get(), d_x.get(), static_cast<int64_t>(n), accumulate,
                                scratch.get(), nullptr);
      const double want = frugal::cpu::sum_squares(x.data(), static_cast<int64_t>(n));
      total = (accumulate ? total : 0.0) + want;
      const double got = out.download<double>()[0];
      CHECK(std::fabs(got - total) <= 1e-12 * total);
      accumulate = true;
    }
  }
}

TEST_CASE("cuda sum_squares_many: one norm over many fp32 and bf16 tensors", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  // 150 tensors (three launches of at most 64), fp32 and bf16, aligned and one element off,
  // empty and single ones among them.
  const size_t count = 150;
  std::deque<DeviceBuffer<float>> f32s;  // a deque: the buffers do not move
  std::deque<DeviceBuffer<bf16>> bf16s;
  std::vector<frugal::cuda::SquaresChunk> chunks;
  // The reference in long double: a plain double sum of 20 million terms drifts by about 1e-12
  // itself, the tolerance below.
  long double want = 0.0L;
  for (size_t t = 0; t < count; ++t) {
    const size_t n = t % 17 == 0 ? 0 : t % 13 == 0 ? 1 : (t * 7919) % 300000 + 3;
    const size_t offset = t % 3 == 0 ? 1 : 0;
    if (t % 2 == 0) {
      const FVec x = random_floats(n, rng);
      f32s.emplace_back(n, offset);
      f32s.back().upload(x);
      for (float e : x) want += static_cast<long double>(e) * e;
      chunks.push_back({.f32 = f32s.back().get(), .bf16 = nullptr, .n = int64_t(n)});
    } else {
      const Bf16Data x = random_bf16(n, rng);
      bf16s.emplace_back(n, offset);
      bf16s.back().upload(x.bits);
      for (float e : x.f) want += static_cast<long double>(e) * e;
      chunks.push_back({.f32 = nullptr, .bf16 = bf16s.back().get(), .n = int64_t(n)});
    }
  }
  DeviceBuffer<double> out(1), scratch(static_cast<size_t>(frugal::cuda::kSumSquaresManyScratch));
  frugal::cuda::sum_squares_many(out.get(), chunks.data(), int64_t(count), scratch.get(), nullptr);
  const double got = out.download<double>()[0];
  CHECK(std::fabs(got - static_cast<double>(want)) <= 1e-12 * static_cast<double>(want));
  frugal::cuda::sum_squares_many(out.get(), chunks.data(), int64_t(count), scratch.get(), nullptr);
  CHECK(out.download<double>()[0] == got);  // the same bits run to run
  // One tensor, and none.
  frugal::cuda::sum_squares_many(out.get(), chunks.data() + 1, 1, scratch.get(), nullptr);
  double one = 0.0;
  for (uint16_t bits : bf16s[0].download<uint16_t>()) {
    const float e = frugal::bf16_to_float(bits);
    one += double(e) * e;
  }
  CHECK(std::fabs(out.download<double>()[0] - one) <= 1e-12 * one);
  frugal::cuda::sum_squares_many(out.get(), chunks.data(), 0, scratch.get(), nullptr);
  CHECK(out.download<double>()[0] == 0.0);

  // Nine big tensors: more blocks than one launch's partials hold, so the launches split there.
  const size_t big_n = 9000000;
  const FVec big = random_floats(big_n, rng);
  DeviceBuffer<float> d_big(big_n);
  d_big.upload(big);
  long double big_want = 0.0L;
  for (float e : big) big_want += static_cast<long double>(e) * e;
  const std::vector<frugal::cuda::SquaresChunk> bigs(
      9, {.f32 = d_big.get(), .bf16 = nullptr, .n = int64_t(big_n)});
  frugal::cuda::sum_squares_many(out.get(), bigs.data(), 9, scratch.get(), nullptr);
  const double nine = static_cast<double>(9 * big_want);
  CHECK(std::fabs(out.download<double>()[0] - nine) <= 1e-12 * nine);
}

TEST_CASE("cuda grad_health: counts as the CPU's, the sum as sum_squares' bit for bit", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  // Values at every edge of the bf16 cast (the tie below the smallest normal, subnormals, the
  // largest finite and its tie with inf), NaN and inf, among random ones.
  const uint32_t edges[] = {0x00000001u, 0x007F7FFFu, 0x007F8000u, 0x007F8001u, 0x7F7F7FFFu,
                            0x7F7F8000u, 0x7F800000u, 0x7FC00000u, 0x80000001u, 0xFF7F8000u};
  const size_t scratch_n =
      size_t(frugal::cuda::kGradHealthValues) * frugal::cuda::kSumSquaresScratch;
  DeviceBuffer<double> out(frugal::cuda::kGradHealthValues), norm(1), scratch(scratch_n);
  for (size_t offset : {0, 1}) {
    for (size_t n : {size_t{1}, size_t{13 * 4097}, size_t{3000017}}) {
      INFO("n " << n << " offset " << offset);
      FVec x = random_floats(n, rng);
      for (float& v : x)
        if (rng() % 11 == 0) std::memcpy(&v, &edges[rng() % std::size(edges)], sizeof v);
      DeviceBuffer<float> d_x(n, offset);
      d_x.upload(x);
      frugal::cuda::grad_health(out.get(), d_x.get(), static_cast<int64_t>(n), scratch.get(),
                                nullptr);
      const std::vector<double> got = out.download<double>();
      const frugal::cpu::GradHealthCounts want = frugal::cpu::grad_health(x.data(), int64_t(n));
      CHECK(got[1] == double(want.nonfinite));
      CHECK(got[2] == double(want.bf16_underflow));
      CHECK(got[3] == double(want.bf16_overflow));
      // The sum is sum_squares' (the norm of a step without the pass), bit for bit.
      frugal::cuda::sum_squares(norm.get(), d_x.get(), static_cast<int64_t>(n), false,
                                scratch.get(), nullptr);
      const double plain = norm.download<double>()[0];
      CHECK((got[0] == plain || (std::isnan(got[0]) && std::isnan(plain))));
      // Finite values: against the CPU's sum.
      for (float& v : x)
        if (!std::isfinite(v)) v = 0.5f;
      d_x.upload(x);
      frugal::cuda::grad_health(out.get(), d_x.get(), static_cast<int64_t>(n), scratch.get(),
                                nullptr);
      const double cpu = frugal::cpu::sum_squares(x.data(), int64_t(n));
      CHECK(std::fabs(out.download<double>()[0] - cpu) <= 1e-12 * cpu);
    }
  }
}

TEST_CASE("cuda kernels are bitwise reproducible run to run", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  const int64_t rows = 1037, dim = 200, vocab = 37;
  const size_t n = static_cast<size_t>(rows * dim);
  const Bf16Data x = random_bf16(n, rng), w = random_bf16(static_cast<size_t>(dim), rng),
                 dy = random_bf16(n, rng);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  std::uniform_int_distribution<int32_t> tok_dist(0, static_cast<int32_t>(vocab - 1));
  for (auto& t : tokens) t = tok_dist(rng);
  const FVec grad = random_floats(n, rng);

  DeviceBuffer<bf16> d_x(n), d_w(static_cast<size_t>(dim)), d_dy(n), d_y(n), d_dx(n);
  DeviceBuffer<float> d_rstd(static_cast<size_t>(rows)), d_dw(static_cast<size_t>(dim)),
      d_dtable(static_cast<size_t>(vocab * dim)), d_grad(n),
      scratch(static_cast<size_t>(frugal::cuda::rmsnorm_backward_scratch_floats(rows, dim)));
  DeviceBuffer<int32_t> d_tokens(tokens.size()),
      tok_scratch(static_cast<size_t>(frugal::cuda::embedding_backward_scratch_ints(rows, vocab)));
  DeviceBuffer<double> d_norm(1),
      norm_scratch(static_cast<size_t>(frugal::cuda::kSumSquaresScratch));
  d_x.upload(x.bits);
  d_w.upload(w.bits);
  d_dy.upload(dy.bits);
  d_tokens.upload(tokens);
  d_grad.upload(grad);

  auto run = [&] {
    CUDA_CHECK(cudaMemset(d_dw.get(), 0, sizeof(float) * static_cast<size_t>(dim)));
    CUDA_CHECK(cudaMemset(d_dtable.get(), 0, sizeof(float) * static_cast<size_t>(vocab * dim)));
    frugal::cuda::rmsnorm_forward(d_y.get(), d_rstd.get(), d_x.get(), d_w.get(), rows, dim, kEps,
                                  nullptr);
    frugal::cuda::rmsnorm_backward(d_dx.get(), d_dw.get(), d_dy.get(), d_x.get(), d_w.get(),
                                   d_rstd.get(), nullptr, rows, dim, scratch.get(), nullptr);
    frugal::cuda::embedding_backward(d_dtable.get(), d_dy.get(), d_tokens.get(), rows, vocab, dim,
                                     tok_scratch.get(), nullptr);
    frugal::cuda::sum_squares(d_norm.get(), d_grad.get(), static_cast<int64_t>(n), false,
                              norm_scratch.get(), nullptr);
    struct Result {
      std::vector<uint16_t> y, dx;
      FVec rstd, dw, dtable;
      std::vector<double> norm;
    };
    return Result{d_y.download<uint16_t>(), d_dx.download<uint16_t>(),  d_rstd.download<float>(),
                  d_dw.download<float>(),   d_dtable.download<float>(), d_norm.download<double>()};
  };
  const auto a = run();
  const auto b = run();
  CHECK(a.y == b.y);
  CHECK(a.dx == b.dx);
  CHECK(a.rstd == b.rstd);
  CHECK(a.dw == b.dw);
  CHECK(a.dtable == b.dtable);
  CHECK(a.norm == b.norm);
}

// A bf16 run's block gradients take the RMSNorm's weight gradient directly: the same fp32 sum
// as the fp32 path (the same partials, the same order) added to the widened bf16 value and
// rounded once, bit for bit.
TEST_CASE("cuda rmsnorm backward adds into a bf16 dw as the fp32 one, rounded once, or overwrites",
          "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  const std::pair<int64_t, int64_t> shapes[] = {{1037, 200}, {4096, 2048}, {5, 7}};
  for (const auto& [rows, dim] : shapes) {
    CAPTURE(rows, dim);
    const size_t n = static_cast<size_t>(rows * dim), d = static_cast<size_t>(dim);
    const Bf16Data x = random_bf16(n, rng), w = random_bf16(d, rng), dy = random_bf16(n, rng),
                   dw0 = random_bf16(d, rng);
    DeviceBuffer<bf16> d_x(n), d_w(d), d_dy(n), d_y(n), d_dx(n), d_dw_bf16(d);
    DeviceBuffer<float> d_rstd(static_cast<size_t>(rows)), d_dw(d),
        scratch(static_cast<size_t>(frugal::cuda::rmsnorm_backward_scratch_floats(rows, dim)));
    d_x.upload(x.bits);
    d_w.upload(w.bits);
    d_dy.upload(dy.bits);
    d_dw.upload(dw0.f);
    d_dw_bf16.upload(dw0.bits);
    frugal::cuda::rmsnorm_forward(d_y.get(), d_rstd.get(), d_x.get(), d_w.get(), rows, dim, kEps,
                                  nullptr);
    frugal::cuda::rmsnorm_backward(d_dx.get(), d_dw.get(), d_dy.get(), d_x.get(), d_w.get(),
                                   d_rstd.get(), nullptr, rows, dim, scratch.get(), nullptr);
    const auto dx_fp32_path = d_dx.download<uint16_t>();
    frugal::cuda::rmsnorm_backward(d_dx.get(), d_dw_bf16.get(), d_dy.get(), d_x.get(), d_w.get(),
                                   d_rstd.get(), nullptr, rows, dim, scratch.get(), nullptr);
    const FVec dw = d_dw.download<float>();
    const auto dw_bf16 = d_dw_bf16.download<uint16_t>();
    size_t mismatches = 0, changed = 0;
    for (size_t i = 0; i < d; ++i) {
      mismatches += dw_bf16[i] != frugal::float_to_bf16(dw[i]);
      changed += dw_bf16[i] != dw0.bits[i];
    }
    CHECK(mismatches == 0);
    CHECK(changed > 0);  // it did add
    CHECK(d_dx.download<uint16_t>() == dx_fp32_path);

    // Overwritten (a step's first write into a dw nobody cleared: NaN here): the sum alone,
    // which the calls above added to dw0 in fp32, and rounded once into bf16.
    d_dw.upload(FVec(d, std::nanf("")));
    d_dw_bf16.upload(std::vector<uint16_t>(d, 0x7fc0));
    frugal::cuda::rmsnorm_backward(d_dx.get(), d_dw.get(), d_dy.get(), d_x.get(), d_w.get(),
                                   d_rstd.get(), nullptr, rows, dim, scratch.get(), nullptr,
                                   /*accumulate=*/false);
    frugal::cuda::rmsnorm_backward(d_dx.get(), d_dw_bf16.get(), d_dy.get(), d_x.get(), d_w.get(),
                                   d_rstd.get(), nullptr, rows, dim, scratch.get(), nullptr,
                                   /*accumulate=*/false);
    const FVec sum = d_dw.download<float>();
    const auto sum_bf16 = d_dw_bf16.download<uint16_t>();
    size_t wrong = 0;
    for (size_t i = 0; i < d; ++i)
      wrong += !(dw0.f[i] + sum[i] == dw[i]) || sum_bf16[i] != frugal::float_to_bf16(sum[i]);
    CHECK(wrong == 0);
  }
}

// optim.state_dtype = bf16: the kernels a bf16 run adds, against the CPU's fp32 math on the
// widened values, rounded once to bf16 (the GPU's element math is the CPU's bit for bit).
TEST_CASE("cuda bf16 state: AdamW on bf16 tensors, fp32 sums into bf16, bf16 norms", "[gpu]") {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  const std::vector<size_t> sizes = {1, 37, 4097, 100003, 0, 1025};
  frugal::cuda::AdamWStep step;
  step.lr = 3e-3f;
  step.weight_decay = 0.1f;
  step.grad_scale = 0.5f;
  step.step = 2;
  for (size_t k = 0; k < 2 * sizes.size(); ++k) {
    // Every size twice: aligned (8-byte accesses, a scalar tail), then with the parameter and
    // the gradient one element off (element by element).
    const size_t n = sizes[k % sizes.size()], offset = k / sizes.size();
    INFO("n " << n << " offset " << offset);
    const Bf16Data p = random_bf16(n, rng), g = random_bf16(n, rng, -0.1f, 0.1f),
                   m = random_bf16(n, rng, -0.01f, 0.01f), v = random_bf16(n, rng, 0.0f, 0.001f);
    DeviceBuffer<bf16> dp(n, offset), dg(n, offset), dm(n), dv(n);
    dp.upload(p.bits);
    dg.upload(g.bits);
    dm.upload(m.bits);
    dv.upload(v.bits);
    frugal::cuda::AdamWChunkBf16 c;
    c.param = dp.get();
    c.grad = dg.get();
    c.m = dm.get();
    c.v = dv.get();
    c.n = static_cast<int64_t>(n);
    frugal::cuda::adamw_update(&c, 1, step, nullptr);
    FVec wp = p.f, wm = m.f, wv = v.f;
    frugal::cpu::adamw_update(wp.data(), g.f.data(), wm.data(), wv.data(), static_cast<int64_t>(n),
                              step);
    const auto gp = dp.download<uint16_t>(), gm = dm.download<uint16_t>(),
               gv = dv.download<uint16_t>();
    size_t mismatches = 0;
    for (size_t i = 0; i < n; ++i)
      mismatches += (gp[i] != frugal::float_to_bf16(wp[i])) +
                    (gm[i] != frugal::float_to_bf16(wm[i])) +
                    (gv[i] != frugal::float_to_bf16(wv[i]));
    CHECK(mismatches == 0);

    // y (bf16) += x (fp32): the sum in fp32, rounded once.
    const FVec x = random_floats(n, rng);
    DeviceBuffer<float> dx(n);
    dx.upload(x);
    DeviceBuffer<bf16> dy(n);
    dy.upload(p.bits);
    frugal::cuda::add_inplace(dy.get(), dx.get(), static_cast<int64_t>(n), nullptr);
    const auto gy = dy.download<uint16_t>();
    mismatches = 0;
    for (size_t i = 0; i < n; ++i) mismatches += gy[i] != frugal::float_to_bf16(p.f[i] + x[i]);
    CHECK(mismatches == 0);

    // The sum of squares of bf16 values: exact widening, fp64 sums (16-byte packs where the
    // gradient is aligned); grad_health's sum is the same bit for bit, beside its count of
    // non-finite values (the only one a bf16 value has: it is its own cast).
    if (n == 0) continue;
    DeviceBuffer<double> out(1), scratch(static_cast<size_t>(frugal::cuda::kSumSquaresScratch));
    frugal::cuda::sum_squares(out.get(), dg.get(), static_cast<int64_t>(n), false, scratch.get(),
                              nullptr);
    double want = 0.0;
    for (float e : g.f) want += double(e) * e;
    const double got = out.download<double>()[0];
    CHECK(std::fabs(got - want) <= 1e-12 * want);
    std::vector<uint16_t> with_inf = g.bits;
    with_inf[n / 2] = 0x7F80u;  // +inf
    dg.upload(g.bits);
    DeviceBuffer<double> health(frugal::cuda::kGradHealthValues),
        health_scratch(size_t(frugal::cuda::kGradHealthValues) * frugal::cuda::kSumSquaresScratch);
    frugal::cuda::grad_health(health.get(), dg.get(), static_cast<int64_t>(n), health_scratch.get(),
                              nullptr);
    std::vector<double> h = health.download<double>();
    CHECK(h[0] == got);
    CHECK(h[1] == 0.0);
    dg.upload(with_inf);
    frugal::cuda::grad_health(health.get(), dg.get(), static_cast<int64_t>(n), health_scratch.get(),
                              nullptr);
    h = health.download<double>();
    CHECK(h[1] == 1.0);
    CHECK(std::isinf(h[0]));
  }
}
