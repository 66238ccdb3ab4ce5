// The Hopper attention kernels (flash_attention_sm90.h, head dims 64 and 128) against the CPU
// kernel on awkward shapes: sequences that are not tile multiples, GQA 4:1 and 8:1, q_len !=
// kv_len with positive and negative causal offsets, batch > 1, enough key tiles to go round the
// shared-memory stages several times; against the FlashAttention-2 kernels on the same data;
// bitwise reproducibility; and the allow_sm90 switch of attention.h's launchers (sm90 when
// true, FlashAttention-2 when false: FRUGAL_ATTENTION_SM90=0, which the app reads at start-up).
// Skipped (and says so) without a GPU of compute capability 9.0 or a build with sm_90a.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "attention_support.h"
#include "catch_compat.h"
#include "gpu_support.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_sm90.h"

namespace {

using Bf16 = __nv_bfloat16;
using frugal::test::bitwise_equal;
using frugal::test::count_bad;
using frugal::test::DeviceBuffer;
using frugal::test::from_bf16;
using frugal::test::Magnitudes;
using frugal::test::magnitudes;
using frugal::test::minus;

// True when the sm_90a kernels can run here; says why not once otherwise.
bool have_sm90() {
  static const bool present = [] {
    frugal::cpu::AttentionShape s;
    s.q_len = s.kv_len = 1;
    s.n_heads = s.n_kv_heads = 1;
    s.head_dim = 128;
    if (!frugal::cuda::flash_attention_sm90_supports(s, {}, {})) {
      std::printf("no compute capability 9.0 GPU or no sm_90a build: skipping the sm90 kernels\n");
      return false;
    }
    return true;
  }();
  return present;
}

using frugal::test::AttentionCase;
using frugal::test::shape_of;

void check_case(const AttentionCase& c) {
  const frugal::test::AttentionProblem t = frugal::test::attention_problem(
      shape_of(c),
      static_cast<unsigned>(c.q_len * 1009 + c.kv_len * 31 + c.head_dim + c.n_kv_heads * 7 +
                            c.causal_offset + c.batch * 13 + c.window * 3));
  const frugal::cpu::AttentionShape& s = t.s;
  CAPTURE(c.batch, c.q_len, c.kv_len, c.n_heads, c.n_kv_heads, c.head_dim, c.causal_offset,
          c.window);
  const size_t q_size = t.q_size, kv_size = t.kv_size, lse_size = t.lse_size;
  const Magnitudes mag = magnitudes(s, t.q.f, t.k.f, t.v.f, t.dout.f, t.out_in.f);

  frugal::test::DeviceAttentionInputs in(t);
  DeviceBuffer<Bf16> out_d(q_size), out_fa2_d(q_size);
  DeviceBuffer<float> lse_d(lse_size), lse_fa2_d(lse_size), dq_d(q_size), dk_d(kv_size),
      dv_d(kv_size),
      scratch_d(static_cast<size_t>(frugal::cuda::flash_attention_backward_scratch_floats(s)));
  const cudaStream_t stream = nullptr;
  REQUIRE(frugal::cuda::flash_attention_sm90_supports(s, {in.q.get(), in.k.get(), in.v.get()},
                                                      {dq_d.get()}));

  // Forward into poisoned buffers (bf16 and fp32 NaN): every element must be written.
  CUDA_CHECK(cudaMemset(out_d.get(), 0xff, q_size * sizeof(Bf16)));
  CUDA_CHECK(cudaMemset(lse_d.get(), 0xff, lse_size * sizeof(float)));
  frugal::cuda::flash_attention_sm90_forward(out_d.get(), lse_d.get(), in.q.get(), in.k.get(),
                                             in.v.get(), s, stream);
  const auto out_bits = out_d.download_bits();
  const auto lse = lse_d.download<float>();
  const std::vector<float> out = from_bf16(out_bits);
  CHECK(count_bad("out", out, t.out_ref, mag.out) == 0);
  CHECK(frugal::test::count_bad_lse(lse, t.lse_ref, 1e-5f) == 0);

  // Against the FlashAttention-2 kernel on the same inputs: both are within the tolerance of
  // the exact result, so within twice it of each other; lse to fp32 noise.
  frugal::cuda::flash_attention_forward(out_fa2_d.get(), lse_fa2_d.get(), in.q.get(), in.k.get(),
                                        in.v.get(), s, stream);
  std::vector<double> twice_mag(mag.out.size());
  for (size_t i = 0; i < twice_mag.size(); ++i) twice_mag[i] = 2 * mag.out[i];
  CHECK(count_bad("out vs flash_attention_forward", out, from_bf16(out_fa2_d.download_bits()),
                  twice_mag) == 0);
  CHECK(frugal::test::count_bad_lse(lse, lse_fa2_d.download<float>(), 2e-5f) == 0);

  // Backward, accumulating onto random initial gradients, twice: bitwise the same.
  lse_d.upload(t.lse_ref);
  std::vector<float> dq_runs[2], dk_runs[2], dv_runs[2];
  for (int run = 0; run < 2; ++run) {
    dq_d.upload(t.dq0);
    dk_d.upload(t.dk0);
    dv_d.upload(t.dv0);
    frugal::cuda::flash_attention_sm90_backward(dq_d.get(), dk_d.get(), dv_d.get(), in.dout.get(),
                                                in.q.get(), in.k.get(), in.v.get(), in.out_in.get(),
                                                lse_d.get(), s, scratch_d.get(), stream);
    dq_runs[run] = dq_d.download<float>();
    dk_runs[run] = dk_d.download<float>();
    dv_runs[run] = dv_d.download<float>();
  }
  CHECK(count_bad("dq", minus(dq_runs[0], t.dq0), minus(t.dq_ref, t.dq0), mag.dq) == 0);
  CHECK(count_bad("dk", minus(dk_runs[0], t.dk0), minus(t.dk_ref, t.dk0), mag.dk) == 0);
  CHECK(count_bad("dv", minus(dv_runs[0], t.dv0), minus(t.dv_ref, t.dv0), mag.dv) == 0);
  CHECK(bitwise_equal(dq_runs[0], dq_runs[1]));
  CHECK(bitwise_equal(dk_runs[0], dk_runs[1]));
  CHECK(bitwise_equal(dv_runs[0], dv_runs[1]));

  // The forward is reproducible too.
  frugal::cuda::flash_attention_sm90_forward(out_d.get(), lse_d.get(), in.q.get(), in.k.get(),
                                             in.v.get(), s, stream);
  CHECK(bitwise_equal(out_d.download_bits(), out_bits));
}

}  // namespace

TEST_CASE("cuda sm90 flash attention matches the CPU on awkward shapes", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  if (!have_sm90()) return;
  // batch, q_len, kv_len, n_heads, n_kv_heads, head_dim, causal_offset
  const AttentionCase cases[] = {
      {2, 200, 200, 8, 2, 64, 0},      // GQA 4:1, seq not a tile multiple
      {1, 333, 333, 8, 1, 128, 0},     // GQA 8:1
      {3, 129, 129, 2, 2, 64, 0},      // batch 3, one row past a tile
      {2, 129, 129, 2, 1, 128, 0},     // the same at head dim 128, GQA 2:1
      {1, 260, 140, 8, 2, 128, 0},     // q_len > kv_len: the last rows see every key
      {2, 150, 260, 4, 1, 128, 110},   // a query block after its keys (ring)
      {1, 190, 130, 4, 2, 64, -70},    // negative offset: the first 70 rows see nothing
      {1, 100, 300, 4, 4, 128, 1000},  // offset past the keys: no mask
      {1, 70, 90, 2, 1, 128, -100},    // no row sees a key
      {1, 1, 200, 2, 1, 64, 199},      // one decoding row over many keys
      {1, 300, 77, 4, 1, 64, -150},    // keys ending before most rows start seeing them
      {1, 64, 64, 1, 1, 128, 0},       // exactly one consumer's rows, half a key tile
      {1, 700, 700, 8, 1, 128, 0},     // 6 key tiles: the stage ring wraps (GQA 8:1)
      {2, 530, 530, 8, 2, 64, 0},      // 5 key tiles at head dim 64 (4 stages), batch 2
      {1, 300, 1100, 4, 1, 128, 800},  // a late query block over 9 key tiles (ring)
  };
  for (const AttentionCase& c : cases) check_case(c);
}

TEST_CASE("cuda sm90 flash attention with a sliding window matches the CPU", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  if (!have_sm90()) return;
  // The shared cases, and one at the sm90 tiles (128 keys forward, 64 rows per consumer).
  for (const AttentionCase& c : frugal::test::kWindowCases) check_case(c);
  check_case({1, 1100, 1100, 8, 1, 128, 0, 300});  // the stage ring wraps inside the band
}

TEST_CASE("attention.h's launchers take the sm90 kernels unless allow_sm90 is false",
          "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  if (!have_sm90()) return;
  const frugal::test::AttentionProblem t =
      frugal::test::attention_problem(shape_of({1, 190, 190, 4, 1, 128, 0}), 7);
  const frugal::cpu::AttentionShape& s = t.s;
  frugal::test::DeviceAttentionInputs in(t);
  DeviceBuffer<Bf16> out_d(t.q_size), out_sm90_d(t.q_size), out_fa2_d(t.q_size);
  DeviceBuffer<float> lse_d(t.lse_size), lse_sm90_d(t.lse_size), lse_fa2_d(t.lse_size);
  frugal::cuda::flash_attention_sm90_forward(out_sm90_d.get(), lse_sm90_d.get(), in.q.get(),
                                             in.k.get(), in.v.get(), s, nullptr);
  frugal::cuda::flash_attention_forward(out_fa2_d.get(), lse_fa2_d.get(), in.q.get(), in.k.get(),
                                        in.v.get(), s, nullptr);
  // What attention_forward computes with this allow_sm90.
  auto launcher_with = [&](bool allow_sm90) {
    frugal::cuda::attention_forward(out_d.get(), lse_d.get(), in.q.get(), in.k.get(), in.v.get(), s,
                                    allow_sm90, nullptr);
  };
  auto same_as = [&](DeviceBuffer<Bf16>& out, DeviceBuffer<float>& lse) {
    return bitwise_equal(out_d.download_bits(), out.download_bits()) &&
           bitwise_equal(lse_d.download<float>(), lse.download<float>());
  };
  // The two kernels sum in different orders, so some bit differs: what tells them apart here.
  REQUIRE_FALSE(bitwise_equal(lse_sm90_d.download<float>(), lse_fa2_d.download<float>()));
  launcher_with(true);
  CHECK(same_as(out_sm90_d, lse_sm90_d));
  launcher_with(false);
  CHECK(same_as(out_fa2_d, lse_fa2_d));
}
