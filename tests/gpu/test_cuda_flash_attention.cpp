// The tensor-core attention kernels (head dims 64 and 128) against the CPU kernel on awkward
// shapes: sequences that are not tile multiples, GQA 4:1 and 8:1, q_len != kv_len with positive
// and negative causal offsets, batch > 1; both backward tilings; bitwise reproducibility.
// The tolerance is computed from the data (attention_support.h).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "attention_support.h"
#include "catch_compat.h"
#include "gpu_support.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"

namespace {

using Bf16 = __nv_bfloat16;
using frugal::test::Bf16Data;
using frugal::test::bitwise_equal;
using frugal::test::count_bad;
using frugal::test::DeviceBuffer;
using frugal::test::from_bf16;
using frugal::test::Magnitudes;
using frugal::test::magnitudes;
using frugal::test::minus;
using frugal::test::random_bf16;
using frugal::test::random_floats;
using frugal::test::to_bf16;

struct Case {
  int64_t batch, q_len, kv_len, n_heads, n_kv_heads, head_dim, causal_offset;
};

void check_case(const Case& c) {
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
  std::mt19937 rng(static_cast<unsigned>(c.q_len * 1009 + c.kv_len * 31 + c.head_dim +
                                         c.n_kv_heads * 7 + c.causal_offset));
  // Amplitude 2 makes the softmax peaked enough that a wrong mask or max shows.
  const Bf16Data q = random_bf16(q_size, rng, 2.0f), k = random_bf16(kv_size, rng, 2.0f);
  const Bf16Data v = random_bf16(kv_size, rng, 1.0f), dout = random_bf16(q_size, rng, 1.0f);
  const std::vector<float> dq0 = random_floats(q_size, rng), dk0 = random_floats(kv_size, rng),
                           dv0 = random_floats(kv_size, rng);

  std::vector<float> out_ref(q_size), lse_ref(lse_size);
  frugal::cpu::attention_forward(out_ref.data(), lse_ref.data(), q.f.data(), k.f.data(), v.f.data(),
                                 s);
  // The backward on both sides gets the same out (the reference's, rounded to bf16) and lse.
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
  const Magnitudes mag = magnitudes(s, q.f, k.f, v.f, dout.f, out_in.f);

  DeviceBuffer<Bf16> q_d(q_size), k_d(kv_size), v_d(kv_size), out_d(q_size), dout_d(q_size),
      out_in_d(q_size);
  DeviceBuffer<float> lse_d(lse_size), dq_d(q_size), dk_d(kv_size), dv_d(kv_size),
      scratch_d(static_cast<size_t>(frugal::cuda::attention_backward_scratch_floats(s)));
  q_d.upload(q.h);
  k_d.upload(k.h);
  v_d.upload(v.h);
  dout_d.upload(dout.h);
  out_in_d.upload(out_in.h);
  const cudaStream_t stream = nullptr;
  REQUIRE(
      frugal::cuda::flash_attention_supports(s, {q_d.get(), k_d.get(), v_d.get()}, {dq_d.get()}));

  // Forward into poisoned buffers (bf16 and fp32 NaN): every element must be written.
  CUDA_CHECK(cudaMemset(out_d.get(), 0xff, q_size * sizeof(Bf16)));
  CUDA_CHECK(cudaMemset(lse_d.get(), 0xff, lse_size * sizeof(float)));
  frugal::cuda::attention_forward(out_d.get(), lse_d.get(), q_d.get(), k_d.get(), v_d.get(), s,
                                  stream);
  const auto out_bits = out_d.download_bits();
  const auto lse = lse_d.download<float>();
  std::vector<float> out(q_size);
  for (size_t i = 0; i < q_size; ++i) out[i] = from_bf16(out_bits[i]);
  CHECK(count_bad("out", out, out_ref, mag.out) == 0);
  int64_t lse_bad = 0;
  for (size_t i = 0; i < lse_size; ++i) {
    if (std::isinf(lse_ref[i]))
      lse_bad += !(std::isinf(lse[i]) && lse[i] < 0);
    else
      lse_bad += !(std::abs(lse[i] - lse_ref[i]) <= 1e-5f * (1.0f + std::abs(lse_ref[i])));
  }
  CHECK(lse_bad == 0);

  // Backward, both tilings, accumulating onto random initial gradients.
  lse_d.upload(lse_ref);
  for (const auto tiles : {frugal::cuda::FlashBackwardTiles::kLargeSmem,
                           frugal::cuda::FlashBackwardTiles::kSmallSmem}) {
    CAPTURE(tiles == frugal::cuda::FlashBackwardTiles::kLargeSmem ? "large smem" : "small smem");
    dq_d.upload(dq0);
    dk_d.upload(dk0);
    dv_d.upload(dv0);
    frugal::cuda::flash_attention_backward(dq_d.get(), dk_d.get(), dv_d.get(), dout_d.get(),
                                           q_d.get(), k_d.get(), v_d.get(), out_in_d.get(),
                                           lse_d.get(), s, scratch_d.get(), stream, tiles);
    CHECK(count_bad("dq", minus(dq_d.download<float>(), dq0), minus(dq_ref, dq0), mag.dq) == 0);
    CHECK(count_bad("dk", minus(dk_d.download<float>(), dk0), minus(dk_ref, dk0), mag.dk) == 0);
    CHECK(count_bad("dv", minus(dv_d.download<float>(), dv0), minus(dv_ref, dv0), mag.dv) == 0);
  }

  // Reproducibility: the public launchers twice give bitwise the same results.
  std::vector<uint16_t> out_runs[2];
  std::vector<float> lse_runs[2], dq_runs[2], dk_runs[2], dv_runs[2];
  for (int run = 0; run < 2; ++run) {
    frugal::cuda::attention_forward(out_d.get(), lse_d.get(), q_d.get(), k_d.get(), v_d.get(), s,
                                    stream);
    out_runs[run] = out_d.download_bits();
    lse_runs[run] = lse_d.download<float>();
    dq_d.upload(dq0);
    dk_d.upload(dk0);
    dv_d.upload(dv0);
    frugal::cuda::attention_backward(dq_d.get(), dk_d.get(), dv_d.get(), dout_d.get(), q_d.get(),
                                     k_d.get(), v_d.get(), out_d.get(), lse_d.get(), s,
                                     scratch_d.get(), stream);
    dq_runs[run] = dq_d.download<float>();
    dk_runs[run] = dk_d.download<float>();
    dv_runs[run] = dv_d.download<float>();
  }
  CHECK(bitwise_equal(out_runs[0], out_bits));
  CHECK(bitwise_equal(out_runs[1], out_bits));
  CHECK(bitwise_equal(lse_runs[0], lse_runs[1]));
  CHECK(bitwise_equal(dq_runs[0], dq_runs[1]));
  CHECK(bitwise_equal(dk_runs[0], dk_runs[1]));
  CHECK(bitwise_equal(dv_runs[0], dv_runs[1]));
}

}  // namespace

TEST_CASE("cuda flash attention matches the CPU on awkward shapes", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  // batch, q_len, kv_len, n_heads, n_kv_heads, head_dim, causal_offset
  const Case cases[] = {
      {2, 200, 200, 8, 2, 64, 0},      // GQA 4:1, seq not a tile multiple
      {1, 333, 333, 8, 1, 128, 0},     // GQA 8:1
      {3, 129, 129, 2, 2, 64, 0},      // batch 3, one row past a tile
      {1, 260, 140, 8, 2, 128, 0},     // q_len > kv_len: the last rows see every key
      {2, 150, 260, 4, 1, 128, 110},   // a query block after its keys (ring)
      {1, 190, 130, 4, 2, 64, -70},    // negative offset: the first 70 rows see nothing
      {1, 100, 300, 4, 4, 128, 1000},  // offset past the keys: no mask
      {1, 70, 90, 2, 1, 128, -100},    // no row sees a key
      {1, 1, 200, 2, 1, 64, 199},      // one decoding row over many keys
      {1, 300, 77, 4, 1, 64, -150},    // keys ending before most rows start seeing them
  };
  for (const Case& c : cases) check_case(c);
}

TEST_CASE("cuda flash attention backward needs its scratch", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  frugal::cpu::AttentionShape s;
  s.batch = 1;
  s.q_len = s.kv_len = 64;
  s.n_heads = s.n_kv_heads = 1;
  s.head_dim = 64;
  s.scale = 0.125f;
  CHECK(frugal::cuda::attention_backward_scratch_floats(s) == 2 * 64);
  DeviceBuffer<Bf16> t(64 * 64);
  DeviceBuffer<float> g(64 * 64), lse(64);
  CHECK_THROWS(frugal::cuda::attention_backward(g.get(), g.get(), g.get(), t.get(), t.get(),
                                                t.get(), t.get(), t.get(), lse.get(), s, nullptr,
                                                nullptr));
}
