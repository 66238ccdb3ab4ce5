// CUDA GEMMs (cuBLASLt), attention and cross-entropy against the CPU kernels, run in fp32 on
// the same bf16-rounded inputs, on awkward sizes; and bitwise determinism of two runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"

namespace {

using Bf16 = __nv_bfloat16;

bool have_gpu() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  static bool reported = false;
  if (!ok && !reported) {
    std::printf("no GPU: skipping\n");
    reported = true;
  }
  if (!ok) cudaGetLastError();  // clear the sticky error of a failed query
  return ok;
}

// bf16 bits, rounded to nearest even (inputs are finite).
uint16_t to_bf16(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x = 0;
  std::memcpy(&x, &bits, 4);
  return x;
}

// Random values in [-amplitude, amplitude], rounded to bf16: `f` holds the float values and
// `h` the bf16 bits of the same numbers.
struct Bf16Data {
  std::vector<float> f;
  std::vector<uint16_t> h;
};
Bf16Data random_bf16(size_t n, std::mt19937& rng, float amplitude = 1.0f) {
  std::uniform_real_distribution<float> dist(-amplitude, amplitude);
  Bf16Data d;
  d.f.resize(n);
  d.h.resize(n);
  for (size_t i = 0; i < n; ++i) {
    d.h[i] = to_bf16(dist(rng));
    d.f[i] = from_bf16(d.h[i]);
  }
  return d;
}
std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A device allocation freed on scope exit.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  template <class U>
  void upload(const std::vector<U>& v) {
    static_assert(sizeof(U) == sizeof(T));
    REQUIRE(v.size() == n_);
    CUDA_CHECK(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <class U = T>
  std::vector<U> download() const {
    static_assert(sizeof(U) == sizeof(T));
    std::vector<U> v(n_);
    CUDA_CHECK(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  void zero() { CUDA_CHECK(cudaMemset(p_, 0, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_;
};

std::vector<float> from_bf16(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = from_bf16(h[i]);
  return f;
}

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

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
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

    DeviceArray<Bf16> x_d(x.h.size()), w_d(w.h.size()), dy_d(dy.h.size());
    DeviceArray<Bf16> y_d(static_cast<size_t>(M * N)), dx_d(static_cast<size_t>(M * K));
    DeviceArray<float> dw_d(dw0.size());
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

namespace {

struct AttentionCase {
  int64_t batch, q_len, kv_len, n_heads, n_kv_heads, head_dim, causal_offset;
};

void check_attention(const AttentionCase& c) {
  frugal::cpu::AttentionShape s;
  s.batch = c.batch;
  s.q_len = c.q_len;
  s.kv_len = c.kv_len;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  s.causal_offset = c.causal_offset;
  CAPTURE(c.batch, c.q_len, c.kv_len, c.n_heads, c.n_kv_heads, c.head_dim, c.causal_offset);

  const size_t q_size = static_cast<size_t>(s.batch * s.q_len * s.n_heads * s.head_dim);
  const size_t kv_size = static_cast<size_t>(s.batch * s.kv_len * s.n_kv_heads * s.head_dim);
  const size_t lse_size = static_cast<size_t>(s.batch * s.n_heads * s.q_len);
  std::mt19937 rng(static_cast<unsigned>(c.q_len * 131 + c.head_dim * 7 + c.n_kv_heads));
  // Amplitude 2 makes the softmax peaked enough that a wrong mask or max shows.
  const Bf16Data q = random_bf16(q_size, rng, 2.0f);
  const Bf16Data k = random_bf16(kv_size, rng, 2.0f);
  const Bf16Data v = random_bf16(kv_size, rng);
  const Bf16Data dout = random_bf16(q_size, rng);
  const std::vector<float> dq0 = random_floats(q_size, rng);
  const std::vector<float> dk0 = random_floats(kv_size, rng);
  const std::vector<float> dv0 = random_floats(kv_size, rng);

  // CPU reference in fp32 on the same bf16 values.
  std::vector<float> out_ref(q_size), lse_ref(lse_size);
  frugal::cpu::attention_forward(out_ref.data(), lse_ref.data(), q.f.data(), k.f.data(), v.f.data(),
                                 s);

  DeviceArray<Bf16> q_d(q_size), k_d(kv_size), v_d(kv_size), out_d(q_size), dout_d(q_size);
  DeviceArray<float> lse_d(lse_size), dq_d(q_size), dk_d(kv_size), dv_d(kv_size),
      scratch_d(static_cast<size_t>(frugal::cuda::attention_backward_scratch_floats(s)));
  q_d.upload(q.h);
  k_d.upload(k.h);
  v_d.upload(v.h);
  dout_d.upload(dout.h);
  const cudaStream_t stream = nullptr;
  frugal::cuda::attention_forward(out_d.get(), lse_d.get(), q_d.get(), k_d.get(), v_d.get(), s,
                                  stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto out = out_d.download<uint16_t>();
  const auto lse = lse_d.download();
  CHECK(rel_error(from_bf16(out), out_ref) < 1e-2);
  int lse_bad = 0;
  for (size_t i = 0; i < lse_size; ++i) {
    if (std::isinf(lse_ref[i])) {
      lse_bad += !(std::isinf(lse[i]) && lse[i] < 0);
    } else {
      lse_bad += !(std::abs(lse[i] - lse_ref[i]) <= 1e-3f * (1.0f + std::abs(lse_ref[i])));
    }
  }
  CHECK(lse_bad == 0);
  // Rows that see no key: out exactly 0.
  for (size_t i = 0; i < q_size; ++i) {
    if (out_ref[i] == 0.0f && from_bf16(out[i]) != 0.0f) {
      FAIL_CHECK("out[" << i << "] = " << from_bf16(out[i]) << " for a row that sees nothing");
      break;
    }
  }

  // Backward: both sides get the same out (the reference's, rounded to bf16) and lse.
  Bf16Data out_in;
  out_in.h.resize(q_size);
  out_in.f.resize(q_size);
  for (size_t i = 0; i < q_size; ++i) {
    out_in.h[i] = to_bf16(out_ref[i]);
    out_in.f[i] = from_bf16(out_in.h[i]);
  }
  std::vector<float> dq_ref = dq0, dk_ref = dk0, dv_ref = dv0;
  frugal::cpu::attention_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.f.data(),
                                  q.f.data(), k.f.data(), v.f.data(), out_in.f.data(),
                                  lse_ref.data(), s);
  DeviceArray<Bf16> out_in_d(q_size);
  out_in_d.upload(out_in.h);
  lse_d.upload(lse_ref);
  dq_d.upload(dq0);
  dk_d.upload(dk0);
  dv_d.upload(dv0);
  frugal::cuda::attention_backward(dq_d.get(), dk_d.get(), dv_d.get(), dout_d.get(), q_d.get(),
                                   k_d.get(), v_d.get(), out_in_d.get(), lse_d.get(), s,
                                   scratch_d.get(), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto dq = dq_d.download(), dk = dk_d.download(), dv = dv_d.download();
  // Compare what was added to the random initial values (accumulation, as a ring needs).
  CHECK(rel_error(minus(dq, dq0), minus(dq_ref, dq0)) < 5e-3);
  CHECK(rel_error(minus(dk, dk0), minus(dk_ref, dk0)) < 5e-3);
  CHECK(rel_error(minus(dv, dv0), minus(dv_ref, dv0)) < 5e-3);

  // Determinism: the same launches again give bitwise the same results.
  frugal::cuda::attention_forward(out_d.get(), lse_d.get(), q_d.get(), k_d.get(), v_d.get(), s,
                                  stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CHECK(bitwise_equal(out_d.download<uint16_t>(), out));
  CHECK(bitwise_equal(lse_d.download(), lse));
  lse_d.upload(lse_ref);
  dq_d.upload(dq0);
  dk_d.upload(dk0);
  dv_d.upload(dv0);
  frugal::cuda::attention_backward(dq_d.get(), dk_d.get(), dv_d.get(), dout_d.get(), q_d.get(),
                                   k_d.get(), v_d.get(), out_in_d.get(), lse_d.get(), s,
                                   scratch_d.get(), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
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

namespace {

template <class Logits>
void check_cross_entropy(bool bf16_logits) {
  const int64_t rows = 37, vocab = 1003;
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

  DeviceArray<Logits> logits_d(logits.f.size());
  if constexpr (sizeof(Logits) == 2) {
    logits_d.upload(logits.h);
  } else {
    logits_d.upload(logits.f);
  }
  DeviceArray<int32_t> targets_d(targets.size()), error_d(2);
  DeviceArray<float> row_loss_d(static_cast<size_t>(rows)), loss_sum_d(1);
  DeviceArray<Bf16> dlogits_d(logits.f.size());
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
    CHECK(what.find("1003") != std::string::npos);
  }
  targets_d.upload(targets);
  CHECK_NOTHROW(frugal::cuda::cross_entropy(loss_sum_d.get(), row_loss_d.get(), dlogits_d.get(),
                                            logits_d.get(), targets_d.get(), rows, vocab,
                                            grad_scale, error_d.get(), stream));
}

}  // namespace

TEST_CASE("cuda cross-entropy matches the CPU for bf16 and fp32 logits", "[gpu][cross_entropy]") {
  if (!have_gpu()) return;
  check_cross_entropy<Bf16>(true);
  check_cross_entropy<float>(false);
}
