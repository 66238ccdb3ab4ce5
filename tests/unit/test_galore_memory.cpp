// GaLore's temporaries against galore_memory.h's bound: on the CPU backend every one of them
// goes to the optimizer's scratch arena, whose peak over refreshes (inline and pipelined, exact
// and randomized, both sides, several in flight) must stay within galore_working_bytes and not
// far below it; and the count of refreshes in flight against a second schedule walked here from
// the optimizer's own refresh_due.
#include <algorithm>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/random.h"
#include "optim/galore_adamw.h"
#include "optim/galore_memory.h"
#include "optim/galore_projector.h"
#include "optim_support.h"

using namespace frugal;

namespace {

using frugal::test::random_matrix;
using frugal::test::whole_shard;

const std::vector<std::pair<std::string, Shape>> kMatrices = {
    {"model.layers.0.self_attn.q_proj.weight", {96, 40}},  // right side
    {"model.layers.0.mlp.down_proj.weight", {32, 120}},    // left side
    {"model.layers.0.mlp.up_proj.weight", {72, 56}},
    {"model.layers.1.mlp.down_proj.weight", {48, 88}}};

std::vector<GaloreMatrixRows> rows_of(const std::vector<std::pair<std::string, Shape>>& matrices) {
  std::vector<GaloreMatrixRows> out;
  for (const auto& [name, shape] : matrices) out.push_back({shape, shape[0]});
  return out;
}

// The refreshes in flight at step t's updates, walked from the optimizer's schedule: a refresh
// begun at s > 0 is held until s + stages or the matrix's next start, whichever is first.
int64_t walked_in_flight(const GaloreAdamW& optimizer, const GaloreConfig& config, int64_t steps) {
  int64_t most = 1;
  for (int64_t t = 1; t < steps; ++t) {
    int64_t held = 0;
    for (size_t j = 0; j < kMatrices.size(); ++j) {
      GaloreProjectorSettings settings = config.projector;
      settings.rank = galore_rank_of(kMatrices[j].second, config.projector.rank);
      const int64_t stages = galore_refresh_stages(kMatrices[j].second, settings);
      for (int64_t s = t; s >= 1 && s > t - stages; --s) {
        if (!optimizer.refresh_due(j, s)) continue;
        int64_t next = s + 1;
        while (!optimizer.refresh_due(j, next)) ++next;
        held += t < std::min(s + stages, next) ? 1 : 0;
        break;
      }
    }
    most = std::max(most, held);
  }
  return most;
}

}  // namespace

TEST_CASE("GaLore's temporaries stay within galore_working_bytes", "[galore]") {
  for (const GaloreProjectorKind kind : {GaloreProjectorKind::randomized, GaloreProjectorKind::svd})
    for (const GaloreRefresh refresh : {GaloreRefresh::immediate, GaloreRefresh::pipelined})
      for (const int64_t gap : {int64_t(4), int64_t(13)})
        for (const MomentsOnRefresh moments : {MomentsOnRefresh::keep, MomentsOnRefresh::project})
          for (const bool replica_sums : {false, true}) {
            GaloreConfig galore;
            galore.projector.kind = kind;
            galore.projector.rank = 12;
            galore.projector.oversampling = 4;
            galore.update_proj_gap = gap;
            galore.refresh = refresh;
            galore.moments_on_refresh = moments;
            // Hybrid sharding's projected replica sums (begin_step_across_replicas): one process
            // stands for 2 replicas with the identity as their sum; every R is made in begin_step.
            galore.projected_replica_sums = replica_sums;
            StepCollectives collectives = local_collectives();
            if (replica_sums) collectives.replicas = 2;
            std::vector<TrainableShard> shards;
            for (size_t i = 0; i < kMatrices.size(); ++i)
              shards.push_back(
                  whole_shard(kMatrices[i].first, random_matrix(kMatrices[i].second, i)));
            GaloreAdamW optimizer(shards, AdamWConfig{}, galore);
            const int64_t steps = 3 * gap + 10;
            for (int64_t t = 0; t < steps; ++t) {
              for (size_t i = 0; i < shards.size(); ++i)
                shards[i].grad.copy_from(random_matrix(kMatrices[i].second, 100 + 7 * t + i));
              optimizer.step(1e-3, t + 1, collectives);
            }
            const int64_t in_flight = galore_refreshes_in_flight(rows_of(kMatrices), galore);
            const GaloreWorkingBytes bound =
                galore_working_bytes(rows_of(kMatrices), galore, false, true);
            const size_t peak = optimizer.scratch().stats().peak_bytes;
            INFO("kind " << int(kind) << " refresh " << int(refresh) << " gap " << gap
                         << " moments " << int(moments) << " replica sums " << replica_sums
                         << ": peak " << peak << " bound " << bound.device << " + " << bound.host
                         << ", in flight " << in_flight);
            CHECK(in_flight == (refresh == GaloreRefresh::pipelined
                                    ? walked_in_flight(optimizer, galore, steps)
                                    : 1));
            CHECK(peak > 0);
            CHECK(peak <= bound.device + bound.host);
            CHECK(bound.device + bound.host <= 4 * peak);
          }
}

TEST_CASE("GaLore's working set: a pipelined 7B at rank 1024 holds gigabytes", "[galore]") {
  // Llama-2-7B's 32 blocks on one rank: q, k, v, o [4096, 4096], gate, up [11008, 4096] (right
  // side), down [4096, 11008] (left). Staggered over 200 steps with 9-stage refreshes (7 on the
  // left side), about 224 * 9 / 200 of them overlap.
  std::vector<GaloreMatrixRows> matrices;
  for (int layer = 0; layer < 32; ++layer) {
    for (int k = 0; k < 4; ++k) matrices.push_back({{4096, 4096}, 4096});
    matrices.push_back({{11008, 4096}, 11008});
    matrices.push_back({{11008, 4096}, 11008});
    matrices.push_back({{4096, 11008}, 4096});
  }
  GaloreConfig galore;
  galore.projector.rank = 1024;
  galore.update_proj_gap = 200;
  galore.refresh = GaloreRefresh::pipelined;
  const int64_t in_flight = galore_refreshes_in_flight(matrices, galore);
  CHECK(in_flight >= 224 * 7 / 200);
  CHECK(in_flight <= 224 * 9 / 200 + 2);
  const GaloreWorkingBytes bound = galore_working_bytes(matrices, galore, false, true);
  // At least the snapshots of the refreshes in flight (gate's 11008 x 4096 f32 each) and the
  // 32 left-side projections P^T G [1024, 11008] of a step.
  CHECK(bound.device >= size_t(in_flight) * 11008 * 4096 * 4 + 32ull * 1024 * 11008 * 4);
  galore.refresh = GaloreRefresh::immediate;
  CHECK(galore_working_bytes(matrices, galore, false, true).device < bound.device);
  // A gap of a billion steps (the key allows it): the count comes from the refreshes' phases,
  // not from the gap's steps; none overlaps then, and without stagger all do.
  galore.refresh = GaloreRefresh::pipelined;
  galore.update_proj_gap = 1'000'000'000;
  CHECK(galore_refreshes_in_flight(matrices, galore) == 1);
  galore.stagger = false;
  CHECK(galore_refreshes_in_flight(matrices, galore) == int64_t(matrices.size()));
}
