// Ring attention with packed documents (a query sees only keys of its own document) over 1, 2,
// 3, 4 and 8 MPI ranks equals one rank's ops::attention with the same document bounds: out,
// lse, dq, dk, dv of every rank's tokens, for several documents per sequence that cross chunk
// and rank boundaries, a batch of 2 with different documents, one document spanning the whole
// sequence, 1-token documents, and a window with documents. Only the K/V chunks some rank needs
// travel: the bytes each rank receives equal those its needs give, counted by brute force over
// the positions (none with documents that end at chunk boundaries). And the tiny model trained
// with ring attention on packed documents equals one rank (cp = every rank, dp 2 x cp 2).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "cp_training_support.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model_support.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/ring_attention.h"
#include "parallel/zero3_parameters.h"
#include "ring_support.h"
#include "test_support.h"
#include "train/train_step.h"

using namespace frugal;
using test::random_tensor;
using test::relative_error;

namespace {

using Lengths = std::vector<std::vector<int64_t>>;  // per sequence, its documents' lengths

// The bounds of documents of the given lengths laid back to back in each sequence of `seq`
// tokens, and each token's position in its document (what Batch::positions holds with packing).
struct WholeDocuments {
  ops::DocumentBounds bounds;
  Tensor positions;
};
WholeDocuments whole_documents(const Lengths& lengths, int64_t seq) {
  const int64_t batch = int64_t(lengths.size());
  WholeDocuments w;
  w.bounds.start = Tensor::empty({batch * seq}, DType::i32);
  w.bounds.end = Tensor::empty({batch * seq}, DType::i32);
  w.positions = Tensor::empty({batch * seq}, DType::i32);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t at = 0;
    for (int64_t length : lengths[size_t(b)]) {
      REQUIRE(at + length <= seq);
      for (int64_t p = at; p < at + length; ++p) {
        w.bounds.start.data<int32_t>()[b * seq + p] = int32_t(at);
        w.bounds.end.data<int32_t>()[b * seq + p] = int32_t(at + length);
        w.positions.data<int32_t>()[b * seq + p] = int32_t(p - at);
      }
      at += length;
    }
    REQUIRE(at == seq);
  }
  return w;
}

// This rank's rows of the bounds, through context_parallel_slice (with dummy tokens).
ops::DocumentBounds local_documents(const WholeDocuments& w, const ZigzagLayout& layout,
                                    int64_t batch) {
  Batch whole;
  whole.batch = batch;
  whole.seq = layout.seq_len;
  whole.tokens = Tensor::zeros({batch * layout.seq_len}, DType::i32);
  whole.targets = Tensor::zeros({batch * layout.seq_len}, DType::i32);
  whole.positions = w.positions;
  whole.documents = w.bounds;
  return context_parallel_slice(whole, layout).documents;
}

void check_ring(Comm& cp, int64_t seq, int64_t heads, int64_t kv_heads, uint32_t seed,
                const Lengths& lengths, int64_t window = 0) {
  const int64_t batch = int64_t(lengths.size()), head_dim = 16;
  const double tolerance = 1e-5;
  INFO("cp " << cp.size() << " rank " << cp.rank() << " seq " << seq << " heads " << heads
             << " kv heads " << kv_heads << " window " << window);
  const WholeDocuments w = whole_documents(lengths, seq);

  // The reference: the whole batch on one rank, the CPU kernel with the documents' mask.
  const Tensor q = random_tensor({batch * seq, heads, head_dim}, seed, 2.0f);
  const Tensor k = random_tensor({batch * seq, kv_heads, head_dim}, seed + 1, 2.0f);
  const Tensor v = random_tensor({batch * seq, kv_heads, head_dim}, seed + 2, 1.0f);
  const Tensor dout = random_tensor({batch * seq, heads, head_dim}, seed + 3, 1.0f);
  const ops::Attention ref = ops::attention(q, k, v, batch, window, w.bounds);
  const ops::AttentionGrads ref_grads =
      ops::attention_backward(dout, q, k, v, ref, batch, window, w.bounds);

  // The ring on this rank's slice; one cache for both directions, as the model's operator.
  const ZigzagLayout layout = zigzag_layout(seq, cp.size(), cp.rank());
  const ops::DocumentBounds docs = local_documents(w, layout, batch);
  RingDocumentCache cache;
  const Tensor ql = zigzag_scatter(q, layout, batch), kl = zigzag_scatter(k, layout, batch),
               vl = zigzag_scatter(v, layout, batch);
  const ops::Attention fwd = ring_attention_forward(ql, kl, vl, batch, cp, window, docs, &cache);
  const ops::AttentionGrads grads = ring_attention_backward(
      zigzag_scatter(dout, layout, batch), ql, kl, vl, fwd, batch, cp, window, docs, &cache);

  CHECK(relative_error(fwd.out, zigzag_scatter(ref.out, layout, batch), layout, batch) < tolerance);
  CHECK(relative_error(grads.dq, zigzag_scatter(ref_grads.dq, layout, batch), layout, batch) <
        tolerance);
  CHECK(relative_error(grads.dk, zigzag_scatter(ref_grads.dk, layout, batch), layout, batch) <
        tolerance);
  CHECK(relative_error(grads.dv, zigzag_scatter(ref_grads.dv, layout, batch), layout, batch) <
        tolerance);
  REQUIRE(fwd.lse.shape() == Shape({batch, heads, layout.local_len()}));
  CHECK(test::lse_error(fwd.lse, ref.lse, layout, batch * heads) < tolerance);

  // Without the cache (gathered at each call) the same.
  const ops::Attention again = ring_attention_forward(ql, kl, vl, batch, cp, window, docs);
  CHECK(std::equal(fwd.out.data<float>(), fwd.out.data<float>() + fwd.out.numel(),
                   again.out.data<float>()));
}

// Documents that cross chunk and rank boundaries wherever the ranks cut 37 tokens (chunks of
// 10, 7, 5 or 3 tokens), a 1-token one among them; the second sequence other documents.
const Lengths kMixed = {{5, 12, 1, 9, 10}, {20, 17}};

}  // namespace

TEST_CASE("ring attention with packed documents equals single-rank attention", "[ring][mpi]") {
  auto world = make_mpi_world_comm(60);
  SECTION("several documents, batch 2 with different ones, GQA 4 over 2") {
    check_ring(*world, 37, 4, 2, 11, kMixed);
  }
  SECTION("3 heads over 1, documents of other lengths") {
    check_ring(*world, 37, 3, 1, 23, {{2, 30, 5}, {1, 1, 35}});
  }
  SECTION("one document spanning the whole sequence") {
    check_ring(*world, 37, 4, 2, 31, {{37}, {37}});
  }
  SECTION("1-token documents") {
    check_ring(*world, 37, 4, 2, 37, {std::vector<int64_t>(37, 1), {36, 1}});
  }
  SECTION("one token per chunk") { check_ring(*world, 8, 4, 2, 41, {{3, 1, 4}, {8}}); }
  const ZigzagLayout at37 = zigzag_layout(37, world->size(), world->rank());
  SECTION("a window of 4 with documents") { check_ring(*world, 37, 4, 2, 43, kMixed, 4); }
  SECTION("a window of one chunk with documents") {
    check_ring(*world, 37, 3, 1, 47, {{30, 7}, {3, 34}}, at37.chunk_len);
  }
}

TEST_CASE("ring attention with packed documents on cp sub-groups (dp x cp)", "[ring][mpi]") {
  auto world = make_mpi_world_comm(60);
  if (world->size() != 4) return;  // the split needs 4 ranks: 2 dp groups of 2 cp ranks
  const int dp_rank = world->rank() / 2;
  std::unique_ptr<Comm> cp = world->split(dp_rank, world->rank() % 2);
  REQUIRE(cp->size() == 2);
  check_ring(*cp, 37, 4, 2, 100 + uint32_t(dp_rank),
             dp_rank == 0 ? kMixed : Lengths{{37}, {9, 28}});
}

TEST_CASE("context_parallel_slice carries packed documents", "[ring][mpi]") {
  const int64_t seq = 13, batch = 2;
  const WholeDocuments w = whole_documents({{4, 9}, {1, 6, 6}}, seq);
  for (int P = 1; P <= 3; ++P)
    for (int rank = 0; rank < P; ++rank) {
      const ZigzagLayout layout = zigzag_layout(seq, P, rank);
      const ops::DocumentBounds local = local_documents(w, layout, batch);
      Batch whole;
      whole.batch = batch;
      whole.seq = seq;
      whole.tokens = Tensor::zeros({batch * seq}, DType::i32);
      whole.targets = Tensor::zeros({batch * seq}, DType::i32);
      whole.positions = w.positions;
      whole.documents = w.bounds;
      const Batch slice = context_parallel_slice(whole, layout);
      const std::vector<int64_t> index = zigzag_token_indices(layout);
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < layout.local_len(); ++i) {
          INFO("P " << P << " rank " << rank << " sequence " << b << " row " << i);
          const int64_t row = b * layout.local_len() + i, p = index[size_t(i)];
          if (p < seq) {  // a real token: its own position and bounds
            CHECK(local.start.data<int32_t>()[row] == w.bounds.start.data<int32_t>()[b * seq + p]);
            CHECK(local.end.data<int32_t>()[row] == w.bounds.end.data<int32_t>()[b * seq + p]);
            CHECK(slice.positions.data<int32_t>()[row] == w.positions.data<int32_t>()[b * seq + p]);
          } else {  // padding: a document of one token after the sequence
            CHECK(local.start.data<int32_t>()[row] == p);
            CHECK(local.end.data<int32_t>()[row] == p + 1);
            CHECK(slice.positions.data<int32_t>()[row] == p);
            CHECK(slice.targets.data<int32_t>()[row] == -1);
          }
        }
    }

  // Bounds that do not tile the sequence are named, not sliced.
  const ZigzagLayout layout = zigzag_layout(seq, 2, 0);
  WholeDocuments bad = whole_documents({{4, 9}, {1, 6, 6}}, seq);
  bad.bounds.end.data<int32_t>()[2] = 3;  // position 2 ends its document before position 3's
  CHECK(test::contains(test::error_of([&] { local_documents(bad, layout, batch); }),
                       "documents of sequence 0"));
}

TEST_CASE("ring attention refuses document bounds that do not tile the sequence", "[ring][mpi]") {
  auto world = make_mpi_world_comm(60);
  const int64_t batch = 1, seq = 12;
  const ZigzagLayout layout = zigzag_layout(seq, world->size(), world->rank());
  const ops::DocumentBounds good = local_documents(whole_documents({{5, 7}}, seq), layout, batch);
  // The last rank's rows claim a document that begins after them: every rank gathers the bounds
  // and names the problem alike (no rank is left waiting).
  ops::DocumentBounds bad{good.start.clone(), good.end.clone()};
  if (world->rank() == world->size() - 1) bad.start.data<int32_t>()[0] += 1;
  const Tensor q = zigzag_scatter(random_tensor({seq, 2, 8}, 5, 1.0f), layout, batch);
  CHECK(test::contains(
      test::error_of([&] { ring_attention_forward(q, q, q, batch, *world, 0, bad); }),
      "documents of sequence 0"));
}

namespace {

// Brute force over positions: the halves (bit h: chunk h of `source`'s zigzag rows) of rank
// `source`'s keys that a query of rank `rank` sees in some sequence, causally, within its
// document and the window.
int halves_seen(const WholeDocuments& w, int64_t batch, const ZigzagLayout& layout, int rank,
                int source, int64_t window) {
  const ZigzagLayout at = zigzag_layout(layout.seq_len, layout.cp_size, rank);
  const ZigzagLayout from = zigzag_layout(layout.seq_len, layout.cp_size, source);
  const int64_t seq = layout.seq_len, c = layout.chunk_len;
  int halves = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int qh = 0; qh < 2; ++qh)
      for (int64_t p = at.chunk(qh) * c; p < (at.chunk(qh) + 1) * c && p < seq; ++p)
        for (int kh = 0; kh < 2; ++kh)
          for (int64_t j = from.chunk(kh) * c; j < (from.chunk(kh) + 1) * c && j <= p; ++j)
            if (j >= w.bounds.start.data<int32_t>()[b * seq + p] && (window == 0 || p - j < window))
              halves |= 1 << kh;
  return halves;
}

int chunks_in(int halves) { return (halves & 1) + (halves >> 1 & 1); }

// The bytes this rank receives in ring attention's forward and backward with these documents
// (each gathering the bounds, without a cache) against those its needs, counted by brute force.
void check_traffic(Mesh& mesh, const Lengths& lengths, int64_t seq, int64_t window,
                   bool expect_none) {
  Comm& cp = *mesh.cp;
  const int64_t batch = int64_t(lengths.size()), heads = 2, kv_heads = 1, head_dim = 8;
  const WholeDocuments w = whole_documents(lengths, seq);
  const ZigzagLayout layout = zigzag_layout(seq, cp.size(), cp.rank());
  const ops::DocumentBounds docs = local_documents(w, layout, batch);
  const Tensor q =
      zigzag_scatter(random_tensor({batch * seq, heads, head_dim}, 3, 1.0f), layout, batch);
  const Tensor k =
      zigzag_scatter(random_tensor({batch * seq, kv_heads, head_dim}, 4, 1.0f), layout, batch);
  const Tensor dout =
      zigzag_scatter(random_tensor({batch * seq, heads, head_dim}, 5, 1.0f), layout, batch);

  // Expected: the gather of the bounds (every rank's 2 x i32 [batch * 2c]) and each K/V (and,
  // backward, dK/dV) chunk of f32 [batch * c, kv_heads, head_dim] K and V that a need moves.
  const uint64_t gather = all_gather_bytes(cp.size(), uint64_t(2 * batch * layout.local_len() * 4));
  const uint64_t chunk = uint64_t(2 * batch * layout.chunk_len * kv_heads * head_dim * 4);
  uint64_t kv_in = 0, dkv_in = 0;
  for (int r = 0; r < cp.size(); ++r) {
    if (r == cp.rank()) continue;
    kv_in += chunk * uint64_t(chunks_in(halves_seen(w, batch, layout, cp.rank(), r, window)));
    dkv_in += chunk * uint64_t(chunks_in(halves_seen(w, batch, layout, r, cp.rank(), window)));
  }
  if (expect_none) CHECK(kv_in + dkv_in == 0);

  auto received = [&] {
    return mesh.traffic->bytes(LinkClass::intra_node) + mesh.traffic->bytes(LinkClass::inter_node);
  };
  const uint64_t before = received();
  const ops::Attention fwd = ring_attention_forward(q, k, k, batch, cp, window, docs);
  const uint64_t after_forward = received();
  ring_attention_backward(dout, q, k, k, fwd, batch, cp, window, docs);
  const uint64_t after_backward = received();
  INFO("cp " << cp.size() << " rank " << cp.rank() << " window " << window);
  CHECK(after_forward - before == gather + kv_in);
  CHECK(after_backward - after_forward == gather + kv_in + dkv_in);

  // With a cache, as the model's operator: one gather for the micro-batch's every call, and a
  // new one for new bounds.
  RingDocumentCache cache;
  const ops::Attention cached = ring_attention_forward(q, k, k, batch, cp, window, docs, &cache);
  ring_attention_forward(q, k, k, batch, cp, window, docs, &cache);
  ring_attention_backward(dout, q, k, k, cached, batch, cp, window, docs, &cache);
  CHECK(received() - after_backward == gather + 3 * kv_in + dkv_in);
  const ops::DocumentBounds copy{docs.start.clone(), docs.end.clone()};
  const uint64_t before_copy = received();
  ring_attention_forward(q, k, k, batch, cp, window, copy, &cache);
  CHECK(received() - before_copy == gather + kv_in);
}

}  // namespace

TEST_CASE("ring attention moves only the K/V chunks that share a document", "[ring][mpi]") {
  Mesh mesh = make_mesh(mpi_world_size(), 60);
  REQUIRE(mesh.traffic);
  const int64_t seq = 37;
  const ZigzagLayout layout = zigzag_layout(seq, mesh.cp_size, mesh.cp_rank);
  const int64_t c = layout.chunk_len;
  SECTION("documents that end at chunk boundaries: no K/V moves") {
    // Each chunk one document (the last real one shorter), and in the second sequence pairs
    // of chunks split into two documents each.
    std::vector<int64_t> per_chunk, halves;
    for (int64_t at = 0; at < seq; at += c) {
      const int64_t length = std::min(c, seq - at), first = std::max<int64_t>(1, length / 2);
      per_chunk.push_back(length);
      halves.push_back(first);
      if (length > first) halves.push_back(length - first);
    }
    check_traffic(mesh, {per_chunk, halves}, seq, 0, true);
  }
  SECTION("documents across chunk boundaries: only the chunks they reach") {
    check_traffic(mesh, kMixed, seq, 0, false);
    check_traffic(mesh, {{2, 30, 5}, {1, 1, 35}}, seq, 0, false);
    check_traffic(mesh, {{30, 7}, {3, 34}}, seq, 4, false);
  }
}

namespace {

constexpr int64_t kSequences = 4, kSeq = 37;

// Per sequence of the global batch, its documents (each sequence others).
const Lengths kPacked = {{5, 12, 1, 9, 10}, {20, 17}, {37}, {1, 18, 18}};

// Sequences [first, first + count) of the step's global batch, packed: positions restart at
// each document and a document's last token has no target (the next document's first token is
// not its continuation).
Batch sequences(int64_t first, int64_t count, int64_t step) {
  Batch b = test::slice_of_random_batch(uint32_t(77 + step), kSequences, kSeq, 41, first, count, 9);
  const Lengths lengths(kPacked.begin() + first, kPacked.begin() + first + count);
  const WholeDocuments w = whole_documents(lengths, kSeq);
  b.positions = w.positions;
  b.documents = w.bounds;
  for (int64_t t = 0; t < count * kSeq; ++t)
    if (w.bounds.end.data<int32_t>()[t] == t % kSeq + 1) b.targets.data<int32_t>()[t] = -1;
  return b;
}

void check_against_one_rank(int cp, int64_t sliding_window = 0) {
  test::check_cp_training_against_one_rank(cp, test::cp_test_config({}, sliding_window), kSequences,
                                           kSeq, sequences);
}

}  // namespace

TEST_CASE("ring attention training on packed documents equals one rank", "[cp][mpi]") {
  const int world = mpi_world_size();
  SECTION("cp = every rank") { check_against_one_rank(world); }
  if (world == 4) {
    SECTION("dp = 2 x cp = 2") { check_against_one_rank(2); }
  }
  SECTION("with a sliding window") { check_against_one_rank(world, 6); }
}
