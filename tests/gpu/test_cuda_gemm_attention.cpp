// CUDA GEMMs (cuBLASLt), attention and cross-entropy against the CPU kernels, run in fp32 on
// the same bf16-rounded inputs, on awkward sizes; and bitwise determinism of two runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_support.h"
#include "catch_compat.h"
#include "core/error.h"
#include "gpu_support.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"

namespace {

using Bf16 = __nv_bfloat16;
using frugal::test::AttentionCase;
using frugal::test::Bf16Data;
using frugal::test::bitwise_equal;
using frugal::test::DeviceBuffer;
using frugal::test::from_bf16;
using frugal::test::have_gpu;
using frugal::test::minus;
using frugal::test::random_bf16;
using frugal::test::random_floats;

// ||got - want|| / ||want|| (0 when both are zero).
double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

}  // namespace

TEST_CASE("cuda linear GEMMs match the CPU on awkward sizes", "[gpu][gemm]") {
  if (!have_gpu()) return;
  struct Dims {
    int64_t m, n, k;
  };
  for (const Dims dims : {Dims{13, 37, 48}, Dims{257, 130, 96}}) {
    const int64_t M = dims.m, N = dims.n, K = dims.k;
    CAPTURE(M, N, K);
    std::mt19937 rng(static_cast<unsigned>(M * 1000 + N));
    // x carries one extra leading row: x_d.get() + K is a row block that is not 256-byte
    // aligned, as the model's row chunks are.
    const Bf16Data x = random_bf16(static_cast<size_t>((M + 1) * K), rng);
    const Bf16Data w = random_bf16(static_cast<size_t>(N * K), rng);
    const Bf16Data dy = random_bf16(static_cast<size_t>(M * N), rng);
    const std::vector<float> dw0 = random_floats(static_cast<size_t>(N * K), rng);
    const float* x_rows = x.f.data() + K;

    DeviceBuffer<Bf16> x_d(x.h.size()), w_d(w.h.size()), dy_d(dy.h.size());
    DeviceBuffer<Bf16> y_d(static_cast<size_t>(M * N)), dx_d(static_cast<size_t>(M * K));
    DeviceBuffer<float> dw_d(dw0.size());
    x_d.upload(x.h);
    w_d.upload(w.h);
    dy_d.upload(dy.h);
    dw_d.upload(dw0);

    frugal::cuda::GemmContext ctx;
    const cudaStream_t stream = nullptr;
    frugal::cuda::linear_forward(ctx, y_d.get(), x_d.get() + K, w_d.get(), M, N, K, stream);
    frugal::cuda::linear_backward_input(ctx, dx_d.get(), dy_d.get(), w_d.get(), M, N, K, stream);
    frugal::cuda::linear_backward_weight(ctx, dw_d.get(), dy_d.get(), x_d.get() + K, M, N, K,
                                         stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));

    std::vector<float> y_ref(static_cast<size_t>(M * N)), dx_ref(static_cast<size_t>(M * K));
    std::vector<float> dw_ref = dw0;
    frugal::cpu::linear_forward(y_ref.data(), x_rows, w.f.data(), M, N, K);
    frugal::cpu::linear_backward(dx_ref.data(), dw_ref.data(), dy.f.data(), x_rows, w.f.data(), M,
                                 N, K);

    const auto y = y_d.download<uint16_t>();
    const auto dx = dx_d.download<uint16_t>();
    const auto dw = dw_d.download();
    CHECK(rel_error(from_bf16(y), y_ref) < 1e-2);
    CHECK(rel_error(from_bf16(dx), dx_ref) < 1e-2);
    // fp32 output from exact bf16 products: only the accumulation order differs.
    CHECK(rel_error(minus(dw, dw0), minus(dw_ref, dw0)) < 1e-4);
    CHECK(ctx.cached_plans() == 3);

    // The same calls again: plans come from the cache, results are bitwise identical, and
    // the weight gradient accumulates a second time.
    frugal::cuda::linear_forward(ctx, y_d.get(), x_d.get() + K, w_d.get(), M, N, K, stream);
    frugal::cuda::linear_backward_input(ctx, dx_d.get(), dy_d.get(), w_d.get(), M, N, K, stream);
    dw_d.upload(dw0);
    frugal::cuda::linear_backward_weight(ctx, dw_d.get(), dy_d.get(), x_d.get() + K, M, N, K,
                                         stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CHECK(ctx.cached_plans() == 3);
    CHECK(bitwise_equal(y_d.download<uint16_t>(), y));
    CHECK(bitwise_equal(dx_d.download<uint16_t>(), dx));
    CHECK(bitwise_equal(dw_d.download(), dw));
  }
}

// A bf16 run's block gradients take the weight gradient GEMM directly: dw (bf16) += dy^T x with
// one rounding, against the exact sum (float64) of the bf16 inputs and dw's old values: within
// one rounding (half a bf16 ulp) plus the fp32 accumulation's error. Overwritten (a step's first
// write into gradients nobody cleared), dw's old values are NaN and must not be read: dw is the
// product alone, bf16 and fp32.
TEST_CASE("cuda linear: the weight gradient added into bf16, rounded once, or overwritten",
          "[gpu][gemm]") {
  if (!have_gpu()) return;
  const int64_t M = 1000, N = 130, K = 96;
  std::mt19937 rng(29);
  const Bf16Data x = random_bf16(static_cast<size_t>(M * K), rng);
  const Bf16Data dy = random_bf16(static_cast<size_t>(M * N), rng);
  const Bf16Data dw0 = random_bf16(static_cast<size_t>(N * K), rng, 8.0f);
  DeviceBuffer<Bf16> x_d(x.h.size()), dy_d(dy.h.size()), dw_d(dw0.h.size());
  x_d.upload(x.h);
  dy_d.upload(dy.h);
  frugal::cuda::GemmContext ctx;
  // Bad elements against the float64 sum of `old` (none: overwritten) and the product, given
  // the result and how many bits of mantissa it was rounded to.
  const auto beyond_one_rounding = [&](const std::vector<float>& dw, const std::vector<float>* old,
                                       int mantissa_bits) {
    size_t bad = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < K; ++j) {
        double exact = old ? (*old)[size_t(i * K + j)] : 0.0, magnitude = std::fabs(exact);
        for (int64_t r = 0; r < M; ++r) {
          const double term = double(dy.f[size_t(r * N + i)]) * x.f[size_t(r * K + j)];
          exact += term;
          magnitude += std::fabs(term);
        }
        // Half an ulp of the result's type, with fp32's sum error over the terms.
        const double tolerance =
            std::fabs(exact) * std::ldexp(1.0, -mantissa_bits) + magnitude * 1e-5;
        bad += !(std::fabs(dw[size_t(i * K + j)] - exact) <= tolerance);  // NaN is bad
      }
    return bad;
  };

  dw_d.upload(dw0.h);
  frugal::cuda::linear_backward_weight(ctx, dw_d.get(), dy_d.get(), x_d.get(), M, N, K, nullptr);
  CHECK(beyond_one_rounding(from_bf16(dw_d.download<uint16_t>()), &dw0.f, 8) == 0);

  const std::vector<uint16_t> nan_bf16(dw0.h.size(), 0x7fc0);
  dw_d.upload(nan_bf16);
  frugal::cuda::linear_backward_weight(ctx, dw_d.get(), dy_d.get(), x_d.get(), M, N, K, nullptr,
                                       /*accumulate=*/false);
  CHECK(beyond_one_rounding(from_bf16(dw_d.download<uint16_t>()), nullptr, 8) == 0);

  DeviceBuffer<float> dw32_d(dw0.h.size());
  dw32_d.upload(std::vector<float>(dw0.h.size(), std::nanf("")));
  frugal::cuda::linear_backward_weight(ctx, dw32_d.get(), dy_d.get(), x_d.get(), M, N, K, nullptr,
                                       /*accumulate=*/false);
  CHECK(beyond_one_rounding(dw32_d.download(), nullptr, 23) == 0);

  // No rows (an empty micro-batch): overwritten, the gradient is zeros; added into, unchanged.
  dw_d.upload(nan_bf16);
  frugal::cuda::linear_backward_weight(ctx, dw_d.get(), dy_d.get(), x_d.get(), 0, N, K, nullptr,
                                       /*accumulate=*/false);
  CHECK(dw_d.download<uint16_t>() == std::vector<uint16_t>(dw0.h.size(), 0));
  dw_d.upload(dw0.h);
  frugal::cuda::linear_backward_weight(ctx, dw_d.get(), dy_d.get(), x_d.get(), 0, N, K, nullptr);
  CHECK(dw_d.download<uint16_t>() == dw0.h);
}

TEST_CASE("cuda linear: the residual in the epilogue, input gradients accumulated", "[gpu][gemm]") {
  if (!have_gpu()) return;
  const int64_t M = 257, N = 130, K = 96;
  std::mt19937 rng(17);
  const Bf16Data x = random_bf16(static_cast<size_t>(M * K), rng);
  const Bf16Data w = random_bf16(static_cast<size_t>(N * K), rng);
  const Bf16Data r = random_bf16(static_cast<size_t>(M * N), rng);
  const Bf16Data dy = random_bf16(static_cast<size_t>(M * N), rng);
  const Bf16Data dx0 = random_bf16(static_cast<size_t>(M * K), rng);
  DeviceBuffer<Bf16> x_d(x.h.size()), w_d(w.h.size()), r_d(r.h.size()), dy_d(dy.h.size());
  DeviceBuffer<Bf16> y_d(r.h.size()), dx_d(dx0.h.size());
  x_d.upload(x.h);
  w_d.upload(w.h);
  r_d.upload(r.h);
  dy_d.upload(dy.h);
  dx_d.upload(dx0.h);

  frugal::cuda::GemmContext ctx;
  const cudaStream_t stream = nullptr;
  frugal::cuda::linear_forward(ctx, y_d.get(), x_d.get(), w_d.get(), M, N, K, stream, r_d.get());
  frugal::cuda::linear_backward_input(ctx, dx_d.get(), dy_d.get(), w_d.get(), M, N, K, stream,
                                      /*accumulate=*/true);
  CUDA_CHECK(cudaStreamSynchronize(stream));

  // References in double: y = x W^T + r, dx = dx0 + dy W.
  std::vector<float> y_ref(static_cast<size_t>(M * N)), dx_ref(static_cast<size_t>(M * K));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double sum = r.f[size_t(i * N + j)];
      for (int64_t q = 0; q < K; ++q)
        sum += double(x.f[size_t(i * K + q)]) * w.f[size_t(j * K + q)];
      y_ref[size_t(i * N + j)] = static_cast<float>(sum);
    }
    for (int64_t q = 0; q < K; ++q) {
      double sum = dx0.f[size_t(i * K + q)];
      for (int64_t j = 0; j < N; ++j)
        sum += double(dy.f[size_t(i * N + j)]) * w.f[size_t(j * K + q)];
      dx_ref[size_t(i * K + q)] = static_cast<float>(sum);
    }
  }
  const auto y = from_bf16(y_d.download<uint16_t>());
  const auto dx = from_bf16(dx_d.download<uint16_t>());
  CHECK(rel_error(y, y_ref) < 1e-2);
  CHECK(rel_error(dx, dx_ref) < 1e-2);
  // Without the residual the result is not the reference (the test can fail).
  std::vector<float> y_plain(y_ref.size());
  frugal::cpu::linear_forward(y_plain.data(), x.f.data(), w.f.data(), M, N, K);
  CHECK(rel_error(y_plain, y_ref) > 0.1);

  // In place (the residual is y itself) gives the same bits.
  y_d.upload(r.h);
  frugal::cuda::linear_forward(ctx, y_d.get(), x_d.get(), w_d.get(), M, N, K, stream, y_d.get());
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CHECK(from_bf16(y_d.download<uint16_t>()) == y);
}

namespace {

// With cuts, packed documents (TestDocuments): the reference takes their host arrays, the
// kernels their device ones.
void check_attention(const AttentionCase& c, const frugal::test::DocumentCuts* cuts = nullptr) {
  frugal::cpu::AttentionShape shape = frugal::test::shape_of(c);
  std::optional<frugal::test::TestDocuments> docs;
  if (cuts != nullptr) {
    docs.emplace(shape, *cuts);
    shape.documents = docs->host();
  }
  const frugal::test::AttentionProblem t = frugal::test::attention_problem(
      shape, static_cast<unsigned>(c.q_len * 131 + c.head_dim * 7 + c.n_kv_heads + c.window));
  frugal::cpu::AttentionShape s = t.s;
  if (docs) s.documents = docs->device();
  CAPTURE(c.batch, c.q_len, c.kv_len, c.n_heads, c.n_kv_heads, c.head_dim, c.causal_offset,
          c.window, cuts != nullptr);
  const size_t q_size = t.q_size, kv_size = t.kv_size, lse_size = t.lse_size;

  frugal::test::DeviceAttentionInputs in(t);
  DeviceBuffer<Bf16> out_d(q_size);
  DeviceBuffer<float> lse_d(lse_size), dq_d(q_size), dk_d(kv_size), dv_d(kv_size),
      scratch_d(static_cast<size_t>(frugal::cuda::attention_backward_scratch_floats(s)));
  const cudaStream_t stream = nullptr;
  frugal::cuda::attention_forward(out_d.get(), lse_d.get(), in.q.get(), in.k.get(), in.v.get(), s,
                                  /*allow_sm90=*/true, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto out = out_d.download<uint16_t>();
  const auto lse = lse_d.download();
  CHECK(rel_error(from_bf16(out), t.out_ref) < 1e-2);
  CHECK(frugal::test::count_bad_lse(lse, t.lse_ref, 1e-3f) == 0);
  // Rows that see no key: out exactly 0.
  for (size_t i = 0; i < q_size; ++i) {
    if (t.out_ref[i] == 0.0f && from_bf16(out[i]) != 0.0f) {
      FAIL_CHECK("out[" << i << "] = " << from_bf16(out[i]) << " for a row that sees nothing");
      break;
    }
  }

  // Backward: both sides get the same out (the reference's, rounded to bf16) and lse; the
  // gradients start from the same random values.
  auto backward = [&] {
    lse_d.upload(t.lse_ref);
    dq_d.upload(t.dq0);
    dk_d.upload(t.dk0);
    dv_d.upload(t.dv0);
    frugal::cuda::attention_backward(dq_d.get(), dk_d.get(), dv_d.get(), in.dout.get(), in.q.get(),
                                     in.k.get(), in.v.get(), in.out_in.get(), lse_d.get(), s,
                                     scratch_d.get(), /*allow_sm90=*/true, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  backward();
  const auto dq = dq_d.download(), dk = dk_d.download(), dv = dv_d.download();
  // Compare what was added to the random initial values (accumulation, as a ring needs).
  CHECK(rel_error(minus(dq, t.dq0), minus(t.dq_ref, t.dq0)) < 5e-3);
  CHECK(rel_error(minus(dk, t.dk0), minus(t.dk_ref, t.dk0)) < 5e-3);
  CHECK(rel_error(minus(dv, t.dv0), minus(t.dv_ref, t.dv0)) < 5e-3);

  // Determinism: the same launches again give bitwise the same results.
  frugal::cuda::attention_forward(out_d.get(), lse_d.get(), in.q.get(), in.k.get(), in.v.get(), s,
                                  /*allow_sm90=*/true, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CHECK(bitwise_equal(out_d.download<uint16_t>(), out));
  CHECK(bitwise_equal(lse_d.download(), lse));
  backward();
  CHECK(bitwise_equal(dq_d.download(), dq));
  CHECK(bitwise_equal(dk_d.download(), dk));
  CHECK(bitwise_equal(dv_d.download(), dv));
}

}  // namespace

TEST_CASE("cuda attention matches the CPU: GQA, head dims, causal offsets", "[gpu][attention]") {
  if (!have_gpu()) return;
  // batch, q_len, kv_len, n_heads, n_kv_heads, head_dim, causal_offset
  const AttentionCase cases[] = {
      {2, 77, 77, 8, 2, 64, 0},     // GQA 4:1, seq not a tile multiple
      {2, 77, 77, 8, 1, 128, 0},    // GQA 8:1
      {2, 77, 77, 3, 3, 16, 0},     // 1:1
      {2, 77, 77, 4, 4, 32, 0},     // 1:1, head dim 32
      {1, 40, 77, 4, 1, 64, 37},    // a query block at the end of its keys (ring: q after kv)
      {2, 77, 50, 4, 2, 128, -10},  // negative offset: the first 10 rows see nothing
      {1, 45, 70, 2, 1, 16, -60},   // every row sees nothing
      {1, 50, 64, 4, 2, 64, 200},   // offset past the keys: every row sees every key
      {1, 1, 200, 2, 1, 128, 199},  // a single decoding row over many keys
  };
  for (const AttentionCase& c : cases) check_attention(c);
}

TEST_CASE("cuda attention (simple kernels) with a sliding window matches the CPU",
          "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  // Head dims 16 and 32 take the simple kernels. batch, q_len, kv_len, n_heads, n_kv_heads,
  // head_dim, causal_offset, window.
  const AttentionCase cases[] = {
      {2, 177, 177, 4, 2, 16, 0, 40},   // band over several key and query tiles
      {1, 150, 150, 3, 1, 32, 0, 2},    // each row sees itself and the key before
      {1, 40, 77, 4, 1, 32, 37, 20},    // a query block at the end of its keys (ring)
      {1, 50, 64, 2, 2, 16, 200, 180},  // offset past the keys: only the window limits
      {1, 30, 40, 2, 1, 16, 100, 50},   // every key behind every row's window
      {1, 1, 200, 2, 1, 32, 199, 33},   // a decoding row over a cache
  };
  for (const AttentionCase& c : cases) check_attention(c);
}

TEST_CASE("cuda attention with packed documents matches the CPU", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  // Head dims 16 and 32 take the simple kernels; 64 and 128 the launchers' tensor-core ones
  // (sm90 on a Hopper GPU).
  for (const int64_t head_dim : {16, 32, 64, 128})
    for (const frugal::test::DocumentCase& dc : frugal::test::document_cases(head_dim))
      check_attention(dc.shape, &dc.cuts);
}

TEST_CASE("cuda attention (simple kernels): a packed sequence gives what its documents give alone",
          "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  const frugal::test::ForwardRun forward = [](Bf16* out, float* lse, const Bf16* q, const Bf16* k,
                                              const Bf16* v, const frugal::cpu::AttentionShape& s) {
    frugal::cuda::attention_forward(out, lse, q, k, v, s, /*allow_sm90=*/true, nullptr);
  };
  const frugal::test::BackwardRun backward =
      [](float* dq, float* dk, float* dv, const Bf16* dout, const Bf16* q, const Bf16* k,
         const Bf16* v, const Bf16* out, const float* lse, const frugal::cpu::AttentionShape& s,
         float* scratch) {
        frugal::cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, scratch,
                                         /*allow_sm90=*/true, nullptr);
      };
  for (const int64_t head_dim : {16, 32})
    for (const frugal::test::DocumentCase& dc : frugal::test::document_cases(head_dim))
      if (dc.cuts.key_position0 == 0 && dc.shape.causal_offset == 0)
        frugal::test::check_packed_equals_alone(
            dc, static_cast<unsigned>(dc.shape.q_len + head_dim), forward, backward);
}

namespace {

// vocab 1003: the scalar kernel; 32000: bf16 rows held in registers; 70000: bf16 rows partly
// held, the rest read twice.
template <class Logits>
void check_cross_entropy(bool bf16_logits, int64_t vocab) {
  const int64_t rows = 37;
  CAPTURE(bf16_logits, rows, vocab);
  std::mt19937 rng(7);
  const Bf16Data logits = random_bf16(static_cast<size_t>(rows * vocab), rng, 4.0f);
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
  for (int64_t r = 0; r < rows; ++r) targets[r] = r % 5 == 3 ? -100 : pick(rng);
  const float grad_scale = 1.0f / 30.0f;

  std::vector<float> dlogits_ref(logits.f.size());
  const double loss_ref = frugal::cpu::cross_entropy(dlogits_ref.data(), logits.f.data(),
                                                     targets.data(), rows, vocab, grad_scale);

  DeviceBuffer<Logits> logits_d(logits.f.size());
  if constexpr (sizeof(Logits) == 2) {
    logits_d.upload(logits.h);
  } else {
    logits_d.upload(logits.f);
  }
  DeviceBuffer<int32_t> targets_d(targets.size()), error_d(2);
  DeviceBuffer<float> row_loss_d(static_cast<size_t>(rows)), loss_sum_d(1);
  DeviceBuffer<Bf16> dlogits_d(logits.f.size());
  targets_d.upload(targets);
  error_d.zero();
  loss_sum_d.zero();
  const cudaStream_t stream = nullptr;
  frugal::cuda::cross_entropy(loss_sum_d.get(), row_loss_d.get(), dlogits_d.get(), logits_d.get(),
                              targets_d.get(), rows, vocab, grad_scale, error_d.get(), stream);
  const float loss = loss_sum_d.download()[0];
  CHECK(std::abs(loss - loss_ref) <= 1e-4 * std::abs(loss_ref));
  const auto dlogits = dlogits_d.download<uint16_t>();
  CHECK(rel_error(from_bf16(dlogits), dlogits_ref) < 1e-2);
  // Each gradient within one bf16 ulp of the float64 reference's (one rounding of a value
  // whose exp is exact to a few fp32 ulps).
  const std::vector<float> got = from_bf16(dlogits);
  int64_t beyond = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::abs(double(got[i]) - dlogits_ref[i]) > std::abs(double(dlogits_ref[i])) / 128 + 1e-30)
      ++beyond;
  CHECK(beyond == 0);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] >= 0) continue;
    for (int64_t j = 0; j < vocab; ++j) {
      if (dlogits[r * vocab + j] != 0) {
        FAIL_CHECK("masked row " << r << " has a gradient");
        break;
      }
    }
  }

  // A second chunk accumulates into loss_sum, bitwise reproducibly; no dlogits is fine.
  frugal::cuda::cross_entropy(loss_sum_d.get(), row_loss_d.get(), nullptr, logits_d.get(),
                              targets_d.get(), rows, vocab, grad_scale, error_d.get(), stream,
                              /*check=*/false);
  frugal::cuda::cross_entropy_check(error_d.get(), vocab, stream);
  const float twice = loss_sum_d.download()[0];
  loss_sum_d.zero();
  frugal::cuda::cross_entropy(loss_sum_d.get(), row_loss_d.get(), dlogits_d.get(), logits_d.get(),
                              targets_d.get(), rows, vocab, grad_scale, error_d.get(), stream);
  CHECK(bitwise_equal(loss_sum_d.download(), std::vector<float>{loss}));
  CHECK(bitwise_equal(dlogits_d.download<uint16_t>(), dlogits));
  CHECK(std::abs(twice - 2 * loss) <= 1e-6f * std::abs(loss));

  // An out-of-range target is reported with its row, then the flag is clear again.
  std::vector<int32_t> bad = targets;
  bad[5] = static_cast<int32_t>(vocab);
  targets_d.upload(bad);
  try {
    frugal::cuda::cross_entropy(loss_sum_d.get(), row_loss_d.get(), dlogits_d.get(), logits_d.get(),
                                targets_d.get(), rows, vocab, grad_scale, error_d.get(), stream);
    FAIL_CHECK("no error for an out-of-range target");
  } catch (const frugal::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("row 5") != std::string::npos);
    CHECK(what.find(std::to_string(vocab)) != std::string::npos);
  }
  targets_d.upload(targets);
  CHECK_NOTHROW(frugal::cuda::cross_entropy(loss_sum_d.get(), row_loss_d.get(), dlogits_d.get(),
                                            logits_d.get(), targets_d.get(), rows, vocab,
                                            grad_scale, error_d.get(), stream));
}

}  // namespace

TEST_CASE("cuda cross-entropy matches the CPU for bf16 and fp32 logits", "[gpu][cross_entropy]") {
  if (!have_gpu()) return;
  for (const int64_t vocab : {1003, 32000, 70000}) {
    check_cross_entropy<Bf16>(true, vocab);
    check_cross_entropy<float>(false, vocab);
  }
}
