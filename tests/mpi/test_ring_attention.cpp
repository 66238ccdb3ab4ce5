// Ring attention over 1, 2 and 4 MPI ranks equals single-rank attention: every rank computes
// the whole sequence with the CPU kernel as the reference, then the ring on its zigzag slice,
// and compares out, lse, dq, dk, dv of its own tokens (fp32 tolerance). Sequence lengths that
// need padding (37 is not a multiple of 2P), GQA (4 heads over 2, 3 over 1), batch 2; and, on
// 4 ranks, two cp groups of 2 split from the world (dp x cp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>

#include "catch_compat.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "parallel/ring_attention.h"
#include "ring_support.h"

using namespace frugal;
using test::random_tensor;
using test::relative_error;

namespace {

// window > 0: Mistral's sliding window, in the reference (the CPU kernel, itself checked against
// float64 in test_kernels) and in the ring, which skips the block pairs outside it.
void check_ring(Comm& cp, int64_t seq, int64_t heads, int64_t kv_heads, uint32_t seed,
                int64_t window = 0) {
  const int64_t batch = 2, head_dim = 16;
  const double tolerance = 1e-5;
  INFO("cp " << cp.size() << " rank " << cp.rank() << " seq " << seq << " heads " << heads
             << " kv heads " << kv_heads << " window " << window);

  // The reference: the whole batch on one rank (computed on every rank alike).
  const Tensor q = random_tensor({batch * seq, heads, head_dim}, seed, 2.0f);
  const Tensor k = random_tensor({batch * seq, kv_heads, head_dim}, seed + 1, 2.0f);
  const Tensor v = random_tensor({batch * seq, kv_heads, head_dim}, seed + 2, 1.0f);
  const Tensor dout = random_tensor({batch * seq, heads, head_dim}, seed + 3, 1.0f);
  const ops::Attention ref = ops::attention(q, k, v, batch, window);
  const ops::AttentionGrads ref_grads = ops::attention_backward(dout, q, k, v, ref, batch, window);

  // The ring on this rank's zigzag slice (padding rows zero, so dout is zero there: padding is
  // outside the loss).
  const ZigzagLayout layout = zigzag_layout(seq, cp.size(), cp.rank());
  const ops::Attention fwd =
      ring_attention_forward(zigzag_scatter(q, layout, batch), zigzag_scatter(k, layout, batch),
                             zigzag_scatter(v, layout, batch), batch, cp, window);
  const ops::AttentionGrads grads = ring_attention_backward(
      zigzag_scatter(dout, layout, batch), zigzag_scatter(q, layout, batch),
      zigzag_scatter(k, layout, batch), zigzag_scatter(v, layout, batch), fwd, batch, cp, window);

  CHECK(relative_error(fwd.out, zigzag_scatter(ref.out, layout, batch), layout, batch) < tolerance);
  CHECK(relative_error(grads.dq, zigzag_scatter(ref_grads.dq, layout, batch), layout, batch) <
        tolerance);
  CHECK(relative_error(grads.dk, zigzag_scatter(ref_grads.dk, layout, batch), layout, batch) <
        tolerance);
  CHECK(relative_error(grads.dv, zigzag_scatter(ref_grads.dv, layout, batch), layout, batch) <
        tolerance);

  // lse [batch, heads, local_len] against the reference [batch, heads, seq].
  REQUIRE(fwd.lse.shape() == Shape({batch, heads, layout.local_len()}));
  CHECK(test::lse_error(fwd.lse, ref.lse, layout, batch * heads) < tolerance);

  // Gathered over the group, the key gradients are those of the whole sequence.
  const Tensor dk_all = zigzag_gather(grads.dk, layout, batch, cp);
  double dk_worst = 0, dk_largest = 0;
  for (int64_t e = 0; e < dk_all.numel(); ++e) {
    dk_worst = std::max(dk_worst,
                        double(std::abs(dk_all.data<float>()[e] - ref_grads.dk.data<float>()[e])));
    dk_largest = std::max(dk_largest, double(std::abs(ref_grads.dk.data<float>()[e])));
  }
  CHECK(dk_worst < tolerance * dk_largest);
}

}  // namespace

TEST_CASE("zigzag layout", "[ring][mpi]") {
  const ZigzagLayout l = zigzag_layout(37, 2, 1);
  CHECK(l.padded_len == 40);
  CHECK(l.chunk_len == 10);
  CHECK(l.local_len() == 20);
  const std::vector<int64_t> indices = zigzag_token_indices(l);
  REQUIRE(indices.size() == 20);
  CHECK(indices.front() == 10);
  CHECK(indices[9] == 19);
  CHECK(indices[10] == 20);
  CHECK(indices.back() == 29);
  const ZigzagLayout r0 = zigzag_layout(37, 4, 0);
  CHECK(r0.chunk_len == 5);
  CHECK(zigzag_token_indices(r0) == std::vector<int64_t>{0, 1, 2, 3, 4, 35, 36, 37, 38, 39});
  const Tensor positions = zigzag_positions(r0, 2);
  REQUIRE(positions.numel() == 20);
  CHECK(positions.data<int32_t>()[15] == 35);
  CHECK_THROWS_AS(zigzag_layout(0, 2, 0), Error);
  CHECK_THROWS_AS(zigzag_layout(10, 2, 2), Error);

  // Every rank's slices, placed back, rebuild the whole tensor.
  const int64_t batch = 3, seq = 13;
  const Tensor full = random_tensor({batch * seq, 3, 2}, 7, 1.0f);
  Tensor rebuilt = Tensor::zeros(full.shape(), DType::f32);
  for (int rank = 0; rank < 3; ++rank) {
    const ZigzagLayout lr = zigzag_layout(seq, 3, rank);
    zigzag_place(rebuilt, zigzag_scatter(full, lr, batch), lr, batch);
  }
  CHECK(std::equal(full.data<float>(), full.data<float>() + full.numel(), rebuilt.data<float>()));
}

TEST_CASE("ring attention equals single-rank attention", "[ring][mpi]") {
  auto world = make_mpi_world_comm(60);
  SECTION("4 heads over 2 kv heads, 37 tokens") { check_ring(*world, 37, 4, 2, 11); }
  SECTION("3 heads over 1 kv head, 37 tokens") { check_ring(*world, 37, 3, 1, 23); }
  SECTION("one token per chunk") { check_ring(*world, 8, 4, 2, 31); }
  // Sliding windows: one rank's rows (2 chunks), one chunk, and one that ends inside a chunk.
  // With several ranks most block pairs lie wholly outside and are skipped.
  const ZigzagLayout at37 = zigzag_layout(37, world->size(), world->rank());
  SECTION("window of one rank's rows") { check_ring(*world, 37, 4, 2, 37, at37.local_len()); }
  SECTION("window of one chunk") { check_ring(*world, 37, 3, 1, 41, at37.chunk_len); }
  SECTION("window 7, one token per chunk") {
    check_ring(*world, 37, 4, 2, 43, 7);
    check_ring(*world, 8, 4, 2, 47, 3);
  }

  // Gathered back over the group, the local slices rebuild the input.
  const ZigzagLayout layout = zigzag_layout(37, world->size(), world->rank());
  const Tensor tokens = random_tensor({2 * 37, 5}, 3, 1.0f);
  const Tensor back = zigzag_gather(zigzag_scatter(tokens, layout, 2), layout, 2, *world);
  CHECK(
      std::equal(tokens.data<float>(), tokens.data<float>() + tokens.numel(), back.data<float>()));
}

TEST_CASE("ring attention on cp sub-groups (dp x cp)", "[ring][mpi]") {
  auto world = make_mpi_world_comm(60);
  if (world->size() != 4) return;  // the split needs 4 ranks: 2 dp groups of 2 cp ranks
  const int dp_rank = world->rank() / 2;
  std::unique_ptr<Comm> cp = world->split(dp_rank, world->rank() % 2);
  REQUIRE(cp->size() == 2);
  // Each dp group has its own sequences.
  check_ring(*cp, 37, 4, 2, 100 + uint32_t(dp_rank));
  check_ring(*cp, 29, 3, 1, 200 + uint32_t(dp_rank));
}
