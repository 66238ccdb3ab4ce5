// The tensor-core attention kernels (head dims 64 and 128) against the CPU kernel on awkward
// shapes: sequences that are not tile multiples, GQA 4:1 and 8:1, q_len != kv_len with positive
// and negative causal offsets, batch > 1, sliding windows (tiles wholly outside skipped), packed
// documents (alone and with windows and a ring's offsets; a packed sequence gives what each of
// its documents gives alone); both backward tilings; bitwise reproducibility.
// The tolerance is computed from the data (attention_support.h).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
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
using frugal::test::bitwise_equal;
using frugal::test::count_bad;
using frugal::test::DeviceBuffer;
using frugal::test::from_bf16;
using frugal::test::Magnitudes;
using frugal::test::magnitudes;
using frugal::test::minus;

using frugal::test::AttentionCase;
using frugal::test::DocumentCuts;

// With cuts, packed documents (TestDocuments): the reference and the tolerances take their host
// arrays, the kernels their device ones.
void check_case(const AttentionCase& c, const DocumentCuts* cuts = nullptr) {
  frugal::cpu::AttentionShape shape = frugal::test::shape_of(c);
  std::optional<frugal::test::TestDocuments> docs;
  if (cuts != nullptr) {
    docs.emplace(shape, *cuts);
    shape.documents = docs->host();
  }
  const frugal::test::AttentionProblem t = frugal::test::attention_problem(
      shape, static_cast<unsigned>(c.q_len * 1009 + c.kv_len * 31 + c.head_dim + c.n_kv_heads * 7 +
                                   c.causal_offset + c.window * 3));
  frugal::cpu::AttentionShape s = t.s;
  if (docs) s.documents = docs->device();
  CAPTURE(c.batch, c.q_len, c.kv_len, c.n_heads, c.n_kv_heads, c.head_dim, c.causal_offset,
          c.window, cuts != nullptr);
  const size_t q_size = t.q_size, kv_size = t.kv_size, lse_size = t.lse_size;
  const Magnitudes mag = magnitudes(t.s, t.q.f, t.k.f, t.v.f, t.dout.f, t.out_in.f);

  frugal::test::DeviceAttentionInputs in(t);
  DeviceBuffer<Bf16> out_d(q_size);
  DeviceBuffer<float> lse_d(lse_size), dq_d(q_size), dk_d(kv_size), dv_d(kv_size),
      scratch_d(static_cast<size_t>(frugal::cuda::attention_backward_scratch_floats(s)));
  const cudaStream_t stream = nullptr;
  REQUIRE(frugal::cuda::flash_attention_supports(s, {in.q.get(), in.k.get(), in.v.get()},
                                                 {dq_d.get()}));

  // Forward into poisoned buffers (bf16 and fp32 NaN): every element must be written. These
  // kernels directly (the launchers would take the sm90 ones on a Hopper GPU).
  CUDA_CHECK(cudaMemset(out_d.get(), 0xff, q_size * sizeof(Bf16)));
  CUDA_CHECK(cudaMemset(lse_d.get(), 0xff, lse_size * sizeof(float)));
  frugal::cuda::flash_attention_forward(out_d.get(), lse_d.get(), in.q.get(), in.k.get(),
                                        in.v.get(), s, stream);
  const auto out_bits = out_d.download_bits();
  const auto lse = lse_d.download<float>();
  CHECK(count_bad("out", from_bf16(out_bits), t.out_ref, mag.out) == 0);
  CHECK(frugal::test::count_bad_lse(lse, t.lse_ref, 1e-5f) == 0);

  // Backward, both tilings, accumulating onto random initial gradients.
  lse_d.upload(t.lse_ref);
  for (const auto tiles : {frugal::cuda::FlashBackwardTiles::kLargeSmem,
                           frugal::cuda::FlashBackwardTiles::kSmallSmem}) {
    CAPTURE(tiles == frugal::cuda::FlashBackwardTiles::kLargeSmem ? "large smem" : "small smem");
    dq_d.upload(t.dq0);
    dk_d.upload(t.dk0);
    dv_d.upload(t.dv0);
    frugal::cuda::flash_attention_backward(dq_d.get(), dk_d.get(), dv_d.get(), in.dout.get(),
                                           in.q.get(), in.k.get(), in.v.get(), in.out_in.get(),
                                           lse_d.get(), s, scratch_d.get(), stream, tiles);
    CHECK(count_bad("dq", minus(dq_d.download<float>(), t.dq0), minus(t.dq_ref, t.dq0), mag.dq) ==
          0);
    CHECK(count_bad("dk", minus(dk_d.download<float>(), t.dk0), minus(t.dk_ref, t.dk0), mag.dk) ==
          0);
    CHECK(count_bad("dv", minus(dv_d.download<float>(), t.dv0), minus(t.dv_ref, t.dv0), mag.dv) ==
          0);
  }

  // Reproducibility: the public launchers twice give bitwise the same results.
  std::vector<uint16_t> out_runs[2];
  std::vector<float> lse_runs[2], dq_runs[2], dk_runs[2], dv_runs[2];
  for (int run = 0; run < 2; ++run) {
    frugal::cuda::attention_forward(out_d.get(), lse_d.get(), in.q.get(), in.k.get(), in.v.get(), s,
                                    /*allow_sm90=*/true, stream);
    out_runs[run] = out_d.download_bits();
    lse_runs[run] = lse_d.download<float>();
    dq_d.upload(t.dq0);
    dk_d.upload(t.dk0);
    dv_d.upload(t.dv0);
    frugal::cuda::attention_backward(dq_d.get(), dk_d.get(), dv_d.get(), in.dout.get(), in.q.get(),
                                     in.k.get(), in.v.get(), out_d.get(), lse_d.get(), s,
                                     scratch_d.get(), /*allow_sm90=*/true, stream);
    dq_runs[run] = dq_d.download<float>();
    dk_runs[run] = dk_d.download<float>();
    dv_runs[run] = dv_d.download<float>();
  }
  // (out_bits came from the FA2 kernel itself; the launcher picks sm90 on Hopper, whose
  // rounding differs: the runs are compared with each other.)
  CHECK(bitwise_equal(out_runs[0], out_runs[1]));
  CHECK(bitwise_equal(lse_runs[0], lse_runs[1]));
  CHECK(bitwise_equal(dq_runs[0], dq_runs[1]));
  CHECK(bitwise_equal(dk_runs[0], dk_runs[1]));
  CHECK(bitwise_equal(dv_runs[0], dv_runs[1]));
}

}  // namespace

TEST_CASE("cuda flash attention matches the CPU on awkward shapes", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  // batch, q_len, kv_len, n_heads, n_kv_heads, head_dim, causal_offset
  const AttentionCase cases[] = {
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
  for (const AttentionCase& c : cases) check_case(c);
}

TEST_CASE("cuda flash attention with a sliding window matches the CPU", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  for (const AttentionCase& c : frugal::test::kWindowCases) check_case(c);
}

TEST_CASE("cuda flash attention backward needs its scratch", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  frugal::cpu::AttentionShape s;
  s.batch = 1;
  s.q_len = s.kv_len = 64;
  s.n_heads = s.n_kv_heads = 1;
  s.head_dim = 64;
  s.scale = 0.125f;
  // lse_log2 and Delta per row, and one dQ turn counter for the one 64-row tile.
  CHECK(frugal::cuda::attention_backward_scratch_floats(s) == 2 * 64 + 1);
  DeviceBuffer<Bf16> t(64 * 64);
  DeviceBuffer<float> g(64 * 64), lse(64);
  CHECK_THROWS(frugal::cuda::attention_backward(g.get(), g.get(), g.get(), t.get(), t.get(),
                                                t.get(), t.get(), t.get(), lse.get(), s, nullptr,
                                                /*allow_sm90=*/true, nullptr));
}

TEST_CASE("cuda flash attention with packed documents matches the CPU", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  for (const int64_t head_dim : {64, 128})
    for (const frugal::test::DocumentCase& dc : frugal::test::document_cases(head_dim))
      check_case(dc.shape, &dc.cuts);
}

TEST_CASE("cuda flash attention: a packed sequence gives what its documents give alone",
          "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  const cudaStream_t stream = nullptr;
  const frugal::test::ForwardRun forward = [&](Bf16* out, float* lse, const Bf16* q, const Bf16* k,
                                               const Bf16* v,
                                               const frugal::cpu::AttentionShape& s) {
    frugal::cuda::flash_attention_forward(out, lse, q, k, v, s, stream);
  };
  const frugal::test::BackwardRun backward = [&](float* dq, float* dk, float* dv, const Bf16* dout,
                                                 const Bf16* q, const Bf16* k, const Bf16* v,
                                                 const Bf16* out, const float* lse,
                                                 const frugal::cpu::AttentionShape& s,
                                                 float* scratch) {
    frugal::cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, scratch, stream);
  };
  for (const int64_t head_dim : {64, 128})
    for (const frugal::test::DocumentCase& dc : frugal::test::document_cases(head_dim))
      if (dc.cuts.key_position0 == 0 && dc.shape.causal_offset == 0)
        frugal::test::check_packed_equals_alone(
            dc, static_cast<unsigned>(dc.shape.q_len + head_dim), forward, backward);
}
