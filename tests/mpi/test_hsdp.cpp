// Hybrid sharding (HSDP) on CPU ranks placed as if on two nodes (MeshShape::node_ranks):
// dp_replicate x dp_shard x cp meshes (2 x 1, 2 x 2, 2 x 1 x 2, 2 x 4, 2 x 2 x 2) train like one
// rank holding the whole model with the same global batch (AdamW with clipping, two
// micro-batches, tied and untied embeddings; GaLore with its projections crossing the replicas);
// and the bytes each step's collectives move, counted by the communicators per link class,
// equal the ring formulas computed here from the parameter shapes, for flat ZeRO-3 over both
// nodes, HSDP, and HSDP with GaLore's projected gradients.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model_support.h"
#include "optim/adamw.h"
#include "optim/galore_adamw.h"
#include "parallel/mesh.h"
#include "parallel/ring_attention.h"
#include "parallel/zero3_parameters.h"
#include "test_support.h"
#include "train/train_step.h"

using namespace frugal;

namespace {

constexpr int64_t kSequences = 8, kSeq = 13, kVocab = 37;

LlamaConfig tiny_config(bool tied) {
  LlamaConfig c;
  c.hidden_size = 48;
  c.intermediate_size = 70;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.vocab_size = kVocab;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  return c;
}

// Sequences [first, first + count) of micro-batch `micro` of the step's global batch.
Batch sequences(int64_t first, int64_t count, int64_t step, int64_t micro) {
  return test::slice_of_random_batch(uint32_t(100 * step + micro), kSequences, kSeq, kVocab, first,
                                     count, 5);
}

// This rank's part of a global micro-batch: its dp rank's sequences, its cp rank's tokens.
Batch local_batch(const Mesh& mesh, int64_t step, int64_t micro) {
  const int64_t per_dp = kSequences / mesh.dp_size;
  Batch b = sequences(mesh.dp_rank * per_dp, per_dp, step, micro);
  if (mesh.cp_size == 1) return b;
  return context_parallel_slice(b, zigzag_layout(kSeq, mesh.cp_size, mesh.cp_rank));
}

StepComms comms_of(const Mesh& mesh) {
  StepComms c;
  c.world = mesh.world.get();
  c.shard = mesh.shard.get();
  c.replica = mesh.replica.get();
  return c;
}

struct CpuArenas {
  Arena params{"hsdp params", Device::cpu}, grads{"hsdp grads", Device::cpu},
      gathered{"hsdp gathered", Device::cpu}, optim{"hsdp optim", Device::cpu};
  Zero3Arenas zero3() { return {&params, &grads, &gathered}; }
};

GaloreConfig galore_config(bool projected) {
  GaloreConfig g;
  g.projector.kind = GaloreProjectorKind::randomized;
  g.projector.rank = 8;
  g.update_proj_gap = 3;
  g.seed = 11;
  g.projected_replica_sums = projected;
  return g;
}

// Which parameters' gradients GaLore sums across the replicas itself.
bool galore_matrix(const ParamSpec& p) { return p.trainable && galore_projects(p.name, p.shape); }

enum class Opt { adamw, galore };

void check_against_one_rank(const MeshShape& shape, bool tied, Opt opt) {
  Mesh mesh = make_mesh(shape, 60);
  const LlamaConfig config = tiny_config(tied);
  // No clipping with GaLore: its norm under projected replica sums counts the projections.
  const AdamWConfig adamw{0.9, 0.95, 1e-6, 0.1, opt == Opt::galore ? 0.0 : 0.5};

  LlamaModel reference_model(config);
  LocalParameters whole(config, 5, 0.05f, true);
  std::unique_ptr<Optimizer> whole_opt;
  if (opt == Opt::galore)
    whole_opt = std::make_unique<GaloreAdamW>(whole.trainable(), adamw, galore_config(false));
  else
    whole_opt = std::make_unique<AdamW>(whole.trainable(), adamw);

  LlamaModel model(config);
  AttentionOperator ring;
  if (mesh.cp_size > 1) {
    ring = ring_attention_operator(*mesh.cp);
    model.set_attention(&ring);
  }
  CpuArenas arenas;
  Zero3Replicas replicas;
  replicas.comm = mesh.replica.get();
  if (opt == Opt::galore) replicas.summed_elsewhere = galore_matrix;
  Zero3Parameters sharded(llama_units(config), *mesh.shard, arenas.zero3(), 5, 0.05f, true, {},
                          replicas);
  std::unique_ptr<Optimizer> sharded_opt;
  if (opt == Opt::galore)
    sharded_opt = std::make_unique<GaloreAdamW>(sharded.trainable(), adamw, galore_config(true),
                                                arenas.optim);
  else
    sharded_opt = std::make_unique<AdamW>(sharded.trainable(), adamw, arenas.optim);

  INFO(mesh.describe() << (tied ? ", tied" : ", untied")
                       << (opt == Opt::galore ? ", GaLore" : ", AdamW"));
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<Batch> whole_batches, rank_batches;
    for (int64_t micro = 0; micro < 2; ++micro) {
      whole_batches.push_back(sequences(0, kSequences, step, micro));
      rank_batches.push_back(local_batch(mesh, step, micro));
    }
    StepResult a = train_step(reference_model, whole, *whole_opt, whole_batches, nullptr, 2e-3,
                              step, CheckpointPolicy::none);
    StepResult b = train_step(model, sharded, *sharded_opt, rank_batches, comms_of(mesh), 2e-3,
                              step, CheckpointPolicy::selective);
    INFO("step " << step);
    CHECK(b.tokens == a.tokens);
    CHECK(b.loss == Approx(a.loss).epsilon(1e-5));
    if (opt == Opt::adamw) CHECK(b.grad_norm == Approx(a.grad_norm).epsilon(1e-4));
  }
  std::string worst;
  const double difference =
      test::max_weight_difference(sharded, whole, llama_units(config), &worst);
  INFO("largest weight difference " << difference << " at " << worst);
  CHECK(difference < 1e-5);
  if (mesh.world->rank() == 0)
    std::printf("%s, %s, %s: weights off one rank by %.3g\n", mesh.describe().c_str(),
                tied ? "tied" : "untied", opt == Opt::galore ? "GaLore" : "AdamW", difference);
}

// The meshes of this many ranks, each as two nodes of world / 2 ranks: dp_shard and cp.
std::vector<MeshShape> two_node_meshes(int world) {
  const int64_t node = std::max(1, world / 2);
  std::vector<MeshShape> out;
  if (world == 2) out.push_back({1, 1, node});  // 2 x 1
  if (world == 4) {
    out.push_back({1, 2, node});  // 2 x 2
    out.push_back({2, 1, node});  // 2 x 1 x 2
  }
  if (world == 8) {
    out.push_back({1, 4, node});  // 2 x 4
    out.push_back({2, 2, node});  // 2 x 2 x 2
  }
  return out;
}

}  // namespace

TEST_CASE("HSDP equals one rank", "[hsdp][mpi]") {
  const int world = mpi_world_size();
  if (world == 1) {
    // One node, one replica: the mesh is flat ZeRO-3 of one rank.
    check_against_one_rank({1, 0, 0}, false, Opt::adamw);
    return;
  }
  for (const MeshShape& shape : two_node_meshes(world)) {
    Mesh probe = make_mesh(shape, 60);
    REQUIRE(probe.dp_replicate == 2);
    REQUIRE(probe.nodes() == 2);
    REQUIRE(probe.shard->topology().link() == LinkClass::intra_node);
    REQUIRE(probe.replica->topology().link() == LinkClass::inter_node);
    for (bool tied : {false, true}) check_against_one_rank(shape, tied, Opt::adamw);
    check_against_one_rank(shape, false, Opt::galore);
  }
}

TEST_CASE("the default dp_shard is one node's ranks", "[hsdp][mpi]") {
  const int world = mpi_world_size();
  if (world % 2 != 0) return;
  Mesh mesh = make_mesh({1, 0, world / 2}, 60);
  CHECK(mesh.dp_shard == world / 2);
  CHECK(mesh.dp_replicate == (world > 1 ? 2 : 1));
  // cp 2 on nodes of one rank cannot make a replica of a node: one replica of every rank.
  if (world == 2) {
    Mesh across = make_mesh({2, 0, 1}, 60);
    CHECK(across.dp_replicate == 1);
    CHECK(across.shard->size() == 2);
  }
  if (world >= 4) {
    CHECK(test::contains(test::error_of([] {
                           make_mesh({1, 3, 0}, 60);
                         }),
                         "config key 'parallel.dp_shard': 3 does not divide"));
    CHECK(test::contains(test::error_of([] {
                           make_mesh({1, 0, 3}, 60);
                         }),
                         "config key 'parallel.node_ranks': 3 does not divide"));
  }
}

namespace {

// Bytes of one rank's padded row shard of `p` over `ranks` ranks (fp32).
uint64_t shard_bytes(const ParamSpec& p, int ranks) {
  const int64_t rows = p.shape[0], row_len = shape_numel(p.shape) / rows;
  return uint64_t((rows + ranks - 1) / ranks * row_len) * 4;
}

struct LinkBytes {
  uint64_t intra = 0, inter = 0;
  void add(LinkClass link, uint64_t bytes) {
    (link == LinkClass::intra_node ? intra : inter) += bytes;
  }
};

// One step of `micro` micro-batches of an untied model, with AdamW or GaLore (no refresh due):
// what the ring formulas say each rank receives. Per micro-batch, the forward gathers the
// embedding, each block and the head once, the backward each block again; every unit's gradients
// are reduce-scattered once. Once per step the replicas all-reduce every gradient shard, or
// under GaLore's projection the other weights' shards, the right side's projected rows
// [local rows, r] (one buffer) and the left side's P^T G [r, n] (one buffer, summed over the
// shard group first).
LinkBytes expected_bytes(const LlamaConfig& config, const Mesh& mesh, int64_t micro,
                         int64_t galore_rank) {
  const int s = mesh.shard->size(), r = mesh.replica->size();
  const LinkClass shard_link = mesh.shard->topology().link();
  const LinkClass replica_link = mesh.replica->topology().link();
  LinkBytes out;
  uint64_t right_floats = 0, left_floats = 0;
  const std::vector<UnitSpec> units = llama_units(config);
  for (size_t u = 0; u < units.size(); ++u) {
    const bool block = u > 0 && u + 1 < units.size();
    for (const ParamSpec& p : units[u].params) {
      const uint64_t shard = shard_bytes(p, s);
      out.add(shard_link, uint64_t(micro) * (block ? 2 : 1) * all_gather_bytes(s, shard));
      out.add(shard_link, uint64_t(micro) * reduce_scatter_bytes(s, shard));
      if (galore_rank > 0 && galore_projects(p.name, p.shape)) {
        const int64_t m = p.shape[0], n = p.shape[1], k = std::min({galore_rank, m, n});
        if (m >= n) {
          const int64_t per = (m + s - 1) / s, place = mesh.shard->rank();
          const int64_t local = std::max<int64_t>(0, std::min(m, (place + 1) * per) - place * per);
          right_floats += uint64_t(local * k);
        } else {
          left_floats += uint64_t(k * n);
        }
        continue;
      }
      out.add(replica_link, all_reduce_bytes(r, shard));
    }
  }
  if (right_floats > 0) out.add(replica_link, all_reduce_bytes(r, right_floats * 4));
  if (left_floats > 0) {
    out.add(shard_link, all_reduce_bytes(s, left_floats * 4));
    out.add(replica_link, all_reduce_bytes(r, left_floats * 4));
  }
  return out;
}

LinkBytes measured_step(const MeshShape& shape, Opt opt, int64_t galore_rank, LinkBytes* expected) {
  Mesh mesh = make_mesh(shape, 60);
  const LlamaConfig config = tiny_config(false);
  const AdamWConfig adamw{0.9, 0.95, 1e-6, 0.1, 1.0};
  LlamaModel model(config);
  CpuArenas arenas;
  Zero3Replicas replicas;
  replicas.comm = mesh.replica.get();
  if (opt == Opt::galore) replicas.summed_elsewhere = galore_matrix;
  Zero3Parameters sharded(llama_units(config), *mesh.shard, arenas.zero3(), 5, 0.05f, true, {},
                          replicas);
  std::unique_ptr<Optimizer> optimizer;
  GaloreConfig galore = galore_config(true);
  galore.projector.rank = galore_rank;
  galore.update_proj_gap = 1000;  // steps 2 and 3 refresh nothing (staggered: matrix 1 at 71)
  if (opt == Opt::galore)
    optimizer = std::make_unique<GaloreAdamW>(sharded.trainable(), adamw, galore, arenas.optim);
  else
    optimizer = std::make_unique<AdamW>(sharded.trainable(), adamw, arenas.optim);
  LinkBytes got;
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<Batch> micro = {local_batch(mesh, step, 0), local_batch(mesh, step, 1)};
    mesh.traffic->reset();
    train_step(model, sharded, *optimizer, micro, comms_of(mesh), 1e-3, step,
               CheckpointPolicy::full);
    got = {mesh.traffic->bytes(LinkClass::intra_node), mesh.traffic->bytes(LinkClass::inter_node)};
  }
  *expected = expected_bytes(config, mesh, 2, opt == Opt::galore ? galore_rank : 0);
  return got;
}

}  // namespace

TEST_CASE("bytes per step per link class match the ring formulas", "[hsdp][mpi]") {
  const int world = mpi_world_size();
  if (world < 4 || world % 2 != 0) return;  // two nodes of at least two ranks
  const int64_t node = world / 2;
  LinkBytes expected;
  // Flat ZeRO-3 over both nodes: every collective's group spans them.
  const LinkBytes flat = measured_step({1, world, node}, Opt::adamw, 0, &expected);
  CHECK(flat.intra == expected.intra);
  CHECK(flat.inter == expected.inter);
  CHECK(flat.intra == 0);
  // HSDP: gathers and reduce-scatters within a node, one all-reduce of the shards across.
  const LinkBytes hsdp = measured_step({1, node, node}, Opt::adamw, 0, &expected);
  CHECK(hsdp.intra == expected.intra);
  CHECK(hsdp.inter == expected.inter);
  // HSDP with GaLore's projections crossing the nodes.
  const LinkBytes galore = measured_step({1, node, node}, Opt::galore, 4, &expected);
  CHECK(galore.intra == expected.intra);
  CHECK(galore.inter == expected.inter);
  CHECK(galore.inter < hsdp.inter);
  if (mpi_world_rank() == 0)
    std::printf(
        "bytes per step on rank 0 (intra-node / inter-node): flat ZeRO-3 %llu / %llu, "
        "HSDP %llu / %llu, HSDP + GaLore rank 4 %llu / %llu\n",
        (unsigned long long)flat.intra, (unsigned long long)flat.inter,
        (unsigned long long)hsdp.intra, (unsigned long long)hsdp.inter,
        (unsigned long long)galore.intra, (unsigned long long)galore.inter);
}
