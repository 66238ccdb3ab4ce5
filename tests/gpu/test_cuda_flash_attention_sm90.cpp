// The Hopper attention kernels (flash_attention_sm90.h, head dims 64 and 128) against the CPU
// kernel on awkward shapes: sequences that are not tile multiples, GQA 4:1 and 8:1, q_len !=
// kv_len with positive and negative causal offsets, batch > 1, enough key tiles to go round the
// shared-memory stages several times, packed documents (with windows and a ring's offsets; a
// packed sequence gives what each of its documents gives alone, through either dQ sum); against
// the FlashAttention-2 kernels on the same data;
// bitwise reproducibility, under load too (the fused dQ's blocks take turns across the grid);
// the forward's walk with a tail of a block per item against other schedules of the same items;
// both ways of summing dQ (fused into the dK/dV pass, or a separate kernel) and the fallback
// from the fused one when dq is not 16-byte aligned; and the allow_sm90 switch of attention.h's
// launchers (sm90 when true, FlashAttention-2 when false: FRUGAL_ATTENTION_SM90=0, which the app
// reads at start-up).
// Skipped (and says so) without a GPU of compute capability 9.0 or a build with sm_90a.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <vector>

#include "attention_support.h"
#include "catch_compat.h"
#include "core/dtype.h"
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

using frugal::cuda::Sm90DqSum;
using frugal::test::AttentionCase;
using frugal::test::shape_of;

// n standard normal values in bf16, drawn from rng.
std::vector<Bf16> random_bf16(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Bf16> x(n);
  for (auto& e : x) e = __float2bfloat16(normal(rng));
  return x;
}

// Elements of q (out, dout, dq), of k (v, dk, dv) and of lse for shape s.
struct Sizes {
  size_t q, kv, lse;
};
Sizes sizes_of(const frugal::cpu::AttentionShape& s) {
  return {size_t(s.batch * s.q_len * s.n_heads * s.head_dim),
          size_t(s.batch * s.kv_len * s.n_kv_heads * s.head_dim),
          size_t(s.batch * s.n_heads * s.q_len)};
}

using frugal::test::DocumentCuts;

// With cuts, packed documents (TestDocuments): the reference and the tolerances take their host
// arrays, the kernels their device ones.
void check_case(const AttentionCase& c, const DocumentCuts* cuts = nullptr) {
  frugal::cpu::AttentionShape shape = shape_of(c);
  std::optional<frugal::test::TestDocuments> docs;
  if (cuts != nullptr) {
    docs.emplace(shape, *cuts);
    shape.documents = docs->host();
  }
  const frugal::test::AttentionProblem t = frugal::test::attention_problem(
      shape,
      static_cast<unsigned>(c.q_len * 1009 + c.kv_len * 31 + c.head_dim + c.n_kv_heads * 7 +
                            c.causal_offset + c.batch * 13 + c.window * 3),
      c.key_growth);
  frugal::cpu::AttentionShape s = t.s;
  if (docs) s.documents = docs->device();
  CAPTURE(c.batch, c.q_len, c.kv_len, c.n_heads, c.n_kv_heads, c.head_dim, c.causal_offset,
          c.window, cuts != nullptr);
  const size_t q_size = t.q_size, kv_size = t.kv_size, lse_size = t.lse_size;
  const Magnitudes mag = magnitudes(t.s, t.q.f, t.k.f, t.v.f, t.dout.f, t.out_in.f);

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

  // Backward, accumulating onto random initial gradients, each way of summing dQ twice: bitwise
  // the same run to run.
  lse_d.upload(t.lse_ref);
  const Sm90DqSum sums[] = {Sm90DqSum::kFused, Sm90DqSum::kSeparateKernel};
  std::vector<float> dq_runs[2][2], dk_runs[2][2], dv_runs[2][2];
  for (int way = 0; way < 2; ++way)
    for (int run = 0; run < 2; ++run) {
      dq_d.upload(t.dq0);
      dk_d.upload(t.dk0);
      dv_d.upload(t.dv0);
      frugal::cuda::flash_attention_sm90_backward(
          dq_d.get(), dk_d.get(), dv_d.get(), in.dout.get(), in.q.get(), in.k.get(), in.v.get(),
          in.out_in.get(), lse_d.get(), s, scratch_d.get(), stream, sums[way]);
      dq_runs[way][run] = dq_d.download<float>();
      dk_runs[way][run] = dk_d.download<float>();
      dv_runs[way][run] = dv_d.download<float>();
    }
  for (int way = 0; way < 2; ++way) {
    CAPTURE(way);  // 0: fused dQ, 1: separate kernel
    CHECK(count_bad("dq", minus(dq_runs[way][0], t.dq0), minus(t.dq_ref, t.dq0), mag.dq) == 0);
    CHECK(count_bad("dk", minus(dk_runs[way][0], t.dk0), minus(t.dk_ref, t.dk0), mag.dk) == 0);
    CHECK(count_bad("dv", minus(dv_runs[way][0], t.dv0), minus(t.dv_ref, t.dv0), mag.dv) == 0);
    CHECK(bitwise_equal(dq_runs[way][0], dq_runs[way][1]));
    CHECK(bitwise_equal(dk_runs[way][0], dk_runs[way][1]));
    CHECK(bitwise_equal(dv_runs[way][0], dv_runs[way][1]));
  }
  // dK and dV do not depend on how dQ is summed.
  CHECK(bitwise_equal(dk_runs[0][0], dk_runs[1][0]));
  CHECK(bitwise_equal(dv_runs[0][0], dv_runs[1][0]));

  // Written as bf16 (into poisoned buffers: every element must be written, masked rows and keys
  // as zeros): the rounding of what the accumulating kernels add to zeros, bit for bit.
  CUDA_CHECK(cudaMemset(dq_d.get(), 0, q_size * sizeof(float)));
  CUDA_CHECK(cudaMemset(dk_d.get(), 0, kv_size * sizeof(float)));
  CUDA_CHECK(cudaMemset(dv_d.get(), 0, kv_size * sizeof(float)));
  frugal::cuda::flash_attention_sm90_backward(
      dq_d.get(), dk_d.get(), dv_d.get(), in.dout.get(), in.q.get(), in.k.get(), in.v.get(),
      in.out_in.get(), lse_d.get(), s, scratch_d.get(), stream, Sm90DqSum::kSeparateKernel);
  DeviceBuffer<Bf16> dq_bf16(q_size), dk_bf16(kv_size), dv_bf16(kv_size);
  CUDA_CHECK(cudaMemset(dq_bf16.get(), 0xff, q_size * sizeof(Bf16)));
  CUDA_CHECK(cudaMemset(dk_bf16.get(), 0xff, kv_size * sizeof(Bf16)));
  CUDA_CHECK(cudaMemset(dv_bf16.get(), 0xff, kv_size * sizeof(Bf16)));
  frugal::cuda::flash_attention_sm90_backward(
      dq_bf16.get(), dk_bf16.get(), dv_bf16.get(), in.dout.get(), in.q.get(), in.k.get(),
      in.v.get(), in.out_in.get(), lse_d.get(), s, scratch_d.get(), stream);
  auto rounded = [](const std::vector<float>& x) {
    std::vector<uint16_t> bits(x.size());
    for (size_t i = 0; i < x.size(); ++i) bits[i] = frugal::float_to_bf16(x[i]);
    return bits;
  };
  CHECK(bitwise_equal(dq_bf16.download_bits(), rounded(dq_d.download<float>())));
  CHECK(bitwise_equal(dk_bf16.download_bits(), rounded(dk_d.download<float>())));
  CHECK(bitwise_equal(dv_bf16.download_bits(), rounded(dv_d.download<float>())));
  CHECK_THROWS(frugal::cuda::flash_attention_sm90_backward(
      dq_bf16.get(), dk_bf16.get(), dv_bf16.get(), in.dout.get(), in.q.get(), in.k.get(),
      in.v.get(), in.out_in.get(), lse_d.get(), s, scratch_d.get(), stream, Sm90DqSum::kFused));

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
      {1, 700, 700, 48, 8, 64, 0},     // 288 forward items: a persistent block walks several
      {1, 4200, 4200, 2, 1, 128, 0},   // 33 query blocks: past persistence, a block per item
      // Head dim 64, three consumers (items of 192 rows): a late query block over 9 key tiles, and
      // 33 items a pair (past persistence), where consumers 0 and 1 leave out diagonal tiles.
      {1, 300, 1100, 4, 1, 64, 800},
      {1, 6200, 6200, 2, 1, 64, 0},
  };
  for (const AttentionCase& c : cases) check_case(c);
}

TEST_CASE("cuda sm90 flash attention with a sliding window matches the CPU", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  if (!have_sm90()) return;
  // The shared cases, and one at the sm90 tiles (128 keys forward, 64 rows per consumer).
  for (const AttentionCase& c : frugal::test::kWindowCases) check_case(c);
  check_case({1, 1100, 1100, 8, 1, 128, 0, 300});  // the stage ring wraps inside the band
  check_case({1, 1100, 1100, 8, 1, 64, 0, 300});   // the same with three consumers
}

TEST_CASE("cuda sm90 flash attention matches the CPU when the scores grow along the keys",
          "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  if (!have_sm90()) return;
  // Keys scaled by up to 9x along the sequence: a row's maximum grows past the one its softmax
  // is taken against by more than 2^8 every few key tiles (about a third of them in a
  // simulation of these inputs), so the forward's lazy rescaling corrects an O that already
  // holds products, which random keys of one scale almost never make it do after a row's
  // first tile.
  check_case({1, 1024, 1024, 4, 2, 128, 0, 0, 8.0f});
  check_case({2, 1000, 1000, 4, 1, 64, 0, 0, 8.0f});
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

TEST_CASE("cuda sm90 fused dQ: the same bits under load, on several waves of blocks",
          "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  if (!have_sm90()) return;
  // Packed documents of 512 tokens (and a few short ones) in the bench's shape: each tile's
  // turn counts only the key blocks of its document.
  std::vector<int> cuts_512, cuts_mixed;
  for (int pos = 512; pos < 2048; pos += 512) cuts_512.push_back(pos);
  for (int pos : {1, 2, 100, 300, 301, 700, 1500}) cuts_mixed.push_back(pos);
  const DocumentCuts docs_512{{cuts_512, cuts_512, cuts_512, cuts_512}};
  const DocumentCuts docs_mixed{{cuts_mixed, cuts_512}};
  struct LoadCase {
    AttentionCase shape;
    const DocumentCuts* cuts = nullptr;
  };
  const LoadCase cases[] = {
      {{4, 2048, 2048, 32, 32, 128, 0}},  // 2048 blocks of keys, the bench's shape
      {{2, 2048, 2048, 32, 4, 64, 0}},    // GQA 8:1 at head dim 64 (TinyLlama)
      {{1, 4096, 4096, 8, 1, 128, 0, 300}},
      {{2, 150, 260, 4, 1, 128, 110}},
      {{1, 300, 1100, 4, 1, 128, 800}},
      {{1, 190, 130, 4, 2, 64, -70}},
      {{4, 2048, 2048, 32, 32, 128, 0}, &docs_512},
      {{2, 2048, 2048, 32, 4, 64, 0}, &docs_mixed},
      {{2, 2048, 2048, 8, 8, 128, 0, 300}, &docs_mixed},
  };
  // Load on a second stream: forwards of another shape, which take SMs away from some of the
  // backward's blocks for a while and so change which of them run together.
  cudaStream_t busy_stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&busy_stream, cudaStreamNonBlocking));
  const frugal::cpu::AttentionShape busy = shape_of({2, 3000, 3000, 8, 8, 128, 0});
  const Sizes busy_size = sizes_of(busy);
  DeviceBuffer<Bf16> busy_in(busy_size.q), busy_out(busy_size.q);
  DeviceBuffer<float> busy_lse(busy_size.lse);
  for (const LoadCase& load_case : cases) {
    const AttentionCase& c = load_case.shape;
    CAPTURE(c.batch, c.q_len, c.kv_len, c.n_heads, c.n_kv_heads, c.head_dim, c.causal_offset,
            c.window, load_case.cuts != nullptr);
    frugal::cpu::AttentionShape s = shape_of(c);
    std::optional<frugal::test::TestDocuments> docs;
    if (load_case.cuts != nullptr) {
      docs.emplace(s, *load_case.cuts);
      s.documents = docs->device();
    }
    const auto [q_size, kv_size, lse_size] = sizes_of(s);
    std::mt19937 rng(unsigned(c.q_len * 7 + c.head_dim));
    DeviceBuffer<Bf16> q(q_size), k(kv_size), v(kv_size), dout(q_size), out(q_size);
    q.upload(random_bf16(rng, q_size));
    k.upload(random_bf16(rng, kv_size));
    v.upload(random_bf16(rng, kv_size));
    dout.upload(random_bf16(rng, q_size));
    DeviceBuffer<float> lse(lse_size), dq(q_size), dk(kv_size), dv(kv_size),
        scratch(size_t(frugal::cuda::flash_attention_backward_scratch_floats(s)));
    frugal::cuda::flash_attention_sm90_forward(out.get(), lse.get(), q.get(), k.get(), v.get(), s,
                                               nullptr);
    std::vector<float> first;
    for (int run = 0; run < 12; ++run) {
      for (int i = 0; i < run % 3; ++i)
        frugal::cuda::flash_attention_sm90_forward(busy_out.get(), busy_lse.get(), busy_in.get(),
                                                   busy_in.get(), busy_in.get(), busy, busy_stream);
      dq.zero();
      dk.zero();
      dv.zero();
      frugal::cuda::flash_attention_sm90_backward(dq.get(), dk.get(), dv.get(), dout.get(), q.get(),
                                                  k.get(), v.get(), out.get(), lse.get(), s,
                                                  scratch.get(), nullptr, Sm90DqSum::kFused);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> now = dq.download<float>();
      if (run == 0)
        first = now;
      else
        REQUIRE(bitwise_equal(now, first));
    }
  }
  CUDA_CHECK(cudaStreamDestroy(busy_stream));
}

TEST_CASE("cuda sm90 forward: a walk with a tail writes the bits of other schedules",
          "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  if (!have_sm90()) return;
  // The bench's shapes, where the forward's persistent walk leaves each sequence's shortest
  // query blocks to a second grid (on an H200's 132 SMs); the same attention one batch element
  // at a time is scheduled otherwise (without a tail). Each item is computed the same wherever it
  // runs, so out and lse must agree bit for bit; the two write into buffers poisoned differently
  // (all ones, all zeros), so every row must be written by one of the whole call's grids.
  const AttentionCase cases[] = {
      {8, 2048, 2048, 32, 32, 128, 0},
      {4, 4096, 4096, 32, 32, 128, 0},
      {4, 2048, 2048, 32, 4, 64, 0},  // TinyLlama
  };
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  for (const AttentionCase& c : cases) {
    CAPTURE(c.batch, c.q_len, c.n_heads, c.n_kv_heads, c.head_dim);
    const frugal::cpu::AttentionShape s = shape_of(c);
    frugal::cpu::AttentionShape one = s;
    one.batch = 1;
    const int64_t tail = frugal::cuda::flash_attention_sm90_forward_tail_blocks(s);
    const int64_t one_tail = frugal::cuda::flash_attention_sm90_forward_tail_blocks(one);
    std::printf("forward tail blocks: %lld for the whole batch, %lld for one element (%d SMs)\n",
                static_cast<long long>(tail), static_cast<long long>(one_tail), sms);
    if (sms == 132) {  // the schedules this test was written against
      CHECK(tail > 0);
      CHECK(tail != one_tail * s.batch);
    }
    const auto [q_size, kv_size, lse_size] = sizes_of(s);
    std::mt19937 rng(unsigned(c.q_len + c.head_dim + c.n_kv_heads));
    DeviceBuffer<Bf16> q(q_size), k(kv_size), v(kv_size), out(q_size), out_one(q_size);
    DeviceBuffer<float> lse(lse_size), lse_one(lse_size);
    q.upload(random_bf16(rng, q_size));
    k.upload(random_bf16(rng, kv_size));
    v.upload(random_bf16(rng, kv_size));
    CUDA_CHECK(cudaMemset(out.get(), 0xff, q_size * sizeof(Bf16)));
    CUDA_CHECK(cudaMemset(lse.get(), 0xff, lse_size * sizeof(float)));
    CUDA_CHECK(cudaMemset(out_one.get(), 0, q_size * sizeof(Bf16)));
    CUDA_CHECK(cudaMemset(lse_one.get(), 0, lse_size * sizeof(float)));
    frugal::cuda::flash_attention_sm90_forward(out.get(), lse.get(), q.get(), k.get(), v.get(), s,
                                               nullptr);
    const size_t q_each = q_size / size_t(s.batch), kv_each = kv_size / size_t(s.batch);
    const size_t lse_each = lse_size / size_t(s.batch);
    for (int64_t b = 0; b < s.batch; ++b)
      frugal::cuda::flash_attention_sm90_forward(
          out_one.get() + b * q_each, lse_one.get() + b * lse_each, q.get() + b * q_each,
          k.get() + b * kv_each, v.get() + b * kv_each, one, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(bitwise_equal(out.download_bits(), out_one.download_bits()));
    CHECK(bitwise_equal(lse.download<float>(), lse_one.download<float>()));
  }
}

TEST_CASE("cuda sm90 backward: dq not 16-byte aligned takes the separate dQ kernel",
          "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  if (!have_sm90()) return;
  // head_dim 128 without GQA: where kAuto would otherwise fuse.
  const AttentionCase c{1, 200, 200, 4, 4, 128, 0};
  const frugal::test::AttentionProblem t = frugal::test::attention_problem(shape_of(c), 5);
  const frugal::cpu::AttentionShape& s = t.s;
  frugal::test::DeviceAttentionInputs in(t);
  // 2 floats in: 8-byte aligned (the kernels' float2 stores) but not 16.
  DeviceBuffer<float> dq(t.q_size, 2), dq_aligned(t.q_size), dk(t.kv_size), dv(t.kv_size),
      lse(t.lse_size), scratch(size_t(frugal::cuda::flash_attention_backward_scratch_floats(s)));
  REQUIRE(frugal::cuda::flash_attention_sm90_supports(s, {in.q.get()}, {dq.get()}));
  lse.upload(t.lse_ref);
  auto backward = [&](float* dq_out, Sm90DqSum sum) {
    frugal::cuda::flash_attention_sm90_backward(dq_out, dk.get(), dv.get(), in.dout.get(),
                                                in.q.get(), in.k.get(), in.v.get(), in.out_in.get(),
                                                lse.get(), s, scratch.get(), nullptr, sum);
  };
  backward(dq.get(), Sm90DqSum::kAuto);
  backward(dq_aligned.get(), Sm90DqSum::kSeparateKernel);
  CHECK(bitwise_equal(dq.download<float>(), dq_aligned.download<float>()));
  CHECK_THROWS(backward(dq.get(), Sm90DqSum::kFused));
}

TEST_CASE("cuda sm90 flash attention with packed documents matches the CPU", "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  if (!have_sm90()) return;
  for (const int64_t head_dim : {64, 128})
    for (const frugal::test::DocumentCase& dc : frugal::test::document_cases(head_dim))
      check_case(dc.shape, &dc.cuts);
  // At the sm90 tiles: documents of 512 tokens and shorter ones in 2k windows, where the stage
  // rings wrap and the forward's items (128 and 192 rows) and the backward's blocks (128 keys)
  // start and end inside documents; a persistent walk over many items (GQA 8:1, 48 heads).
  std::vector<int> cuts_512;
  for (int pos = 512; pos < 2048; pos += 512) cuts_512.push_back(pos);
  const std::vector<int> cuts_mixed = {1, 2, 3, 100, 200, 201, 333, 1000, 1024, 1900};
  const DocumentCuts docs{{cuts_512, cuts_mixed}};
  check_case({2, 2048, 2048, 4, 2, 128, 0}, &docs);
  check_case({2, 2048, 2048, 4, 1, 64, 0}, &docs);
  check_case({2, 2048, 2048, 4, 2, 128, 0, 300}, &docs);
  const std::vector<frugal::test::DocumentCase> cases_64 = frugal::test::document_cases(64);
  check_case({2, 700, 700, 48, 8, 64, 0}, &cases_64[0].cuts);
}

TEST_CASE("cuda sm90 flash attention: a packed sequence gives what its documents give alone",
          "[gpu][attention]") {
  SKIP_WITHOUT_GPU();
  if (!have_sm90()) return;
  const frugal::test::ForwardRun forward = [](Bf16* out, float* lse, const Bf16* q, const Bf16* k,
                                              const Bf16* v, const frugal::cpu::AttentionShape& s) {
    frugal::cuda::flash_attention_sm90_forward(out, lse, q, k, v, s, nullptr);
  };
  for (const Sm90DqSum sum : {Sm90DqSum::kFused, Sm90DqSum::kSeparateKernel}) {
    CAPTURE(sum == Sm90DqSum::kFused ? "fused dQ" : "separate dQ kernel");
    const frugal::test::BackwardRun backward =
        [sum](float* dq, float* dk, float* dv, const Bf16* dout, const Bf16* q, const Bf16* k,
              const Bf16* v, const Bf16* out, const float* lse,
              const frugal::cpu::AttentionShape& s, float* scratch) {
          frugal::cuda::flash_attention_sm90_backward(dq, dk, dv, dout, q, k, v, out, lse, s,
                                                      scratch, nullptr, sum);
        };
    for (const int64_t head_dim : {64, 128})
      for (const frugal::test::DocumentCase& dc : frugal::test::document_cases(head_dim))
        if (dc.cuts.key_position0 == 0 && dc.shape.causal_offset == 0)
          frugal::test::check_packed_equals_alone(
              dc, static_cast<unsigned>(dc.shape.q_len + head_dim), forward, backward);
  }
}
