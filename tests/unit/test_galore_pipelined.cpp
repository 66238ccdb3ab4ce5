// GaLore's pipelined refreshes (galore.refresh = pipelined) against a second schedule computed
// here: the projector a matrix holds at every step is the inline projector (galore_projector)
// of the gradient of the step its latest installed refresh began at, installed exactly
// galore_refresh_stages steps after that; and a save (before_save) completes what is in flight.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/random.h"
#include "ops/ops.h"
#include "optim/galore_adamw.h"
#include "optim/galore_projector.h"
#include "optim_support.h"

using namespace frugal;

namespace {

using frugal::test::random_matrix;
using frugal::test::whole_shard;

Tensor projector_of(GaloreAdamW& optimizer, const std::string& name) {
  for (StateTensor& s : optimizer.state_tensors())
    if (s.name == "optim/galore/projector/" + name) return s.tensor.clone();
  FAIL("no projector of " << name);
  return Tensor();
}

bool equal(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return false;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a.data<float>()[i] != b.data<float>()[i]) return false;
  return true;
}

// The sketch's seed as GaloreAdamW draws it (FNV-1a of the name, the run's seed, the iteration).
uint64_t seed_of(const std::string& name, int64_t t) {
  uint64_t seed = 0xCBF29CE484222325ull;
  for (char ch : name) seed = (seed ^ uint8_t(ch)) * 0x100000001B3ull;
  return seed ^ uint64_t(t) * 0x9E3779B97F4A7C15ull;
}

}  // namespace

TEST_CASE("pipelined refreshes install the inline projector of G_t, stages later", "[galore]") {
  for (const GaloreProjectorKind kind : {GaloreProjectorKind::randomized, GaloreProjectorKind::svd})
    for (const int64_t gap : {int64_t(23), int64_t(5)}) {  // longer and shorter than the stages
      const std::vector<std::pair<std::string, Shape>> matrices = {
          {"model.layers.0.self_attn.q_proj.weight", {37, 29}},  // right side
          {"model.layers.0.mlp.down_proj.weight", {19, 41}},     // left side
          {"model.layers.1.mlp.up_proj.weight", {33, 21}}};
      std::vector<TrainableShard> shards;
      for (size_t i = 0; i < matrices.size(); ++i)
        shards.push_back(whole_shard(matrices[i].first, random_matrix(matrices[i].second, i)));
      GaloreConfig galore;
      galore.projector.kind = kind;
      galore.projector.rank = 6;
      galore.projector.oversampling = 3;
      galore.update_proj_gap = gap;
      galore.refresh = GaloreRefresh::pipelined;
      GaloreAdamW optimizer(shards, AdamWConfig{}, galore);
      GaloreProjectorSettings settings = galore.projector;
      const int64_t stages = galore_refresh_stages(matrices[0].second, settings);
      CHECK(stages == (kind == GaloreProjectorKind::svd ? 1 : 2 + 4 + 1 + 2));
      CHECK(galore_refresh_stages(matrices[1].second, settings) ==
            (kind == GaloreProjectorKind::svd ? 1 : 2 + 4 + 1));

      std::map<std::string, std::vector<Tensor>> grads;  // by step t
      Arena scratch("test scratch", Device::cpu);
      int64_t installs = 0;
      for (int64_t t = 0; t < 3 * gap + 12; ++t) {
        for (size_t i = 0; i < shards.size(); ++i) {
          const Tensor g = random_matrix(matrices[i].second, 1000 + 7 * uint64_t(t) + i);
          shards[i].grad.copy_from(g);
          grads[matrices[i].first].push_back(g);
        }
        optimizer.step(1e-3, t + 1, local_collectives());
        for (size_t j = 0; j < matrices.size(); ++j) {
          // The second schedule: the latest start s <= t whose installation step (the next
          // start of the same matrix, or s + stages, whichever first; t = 0 at once) is <= t.
          const int64_t own = galore_refresh_stages(matrices[j].second, settings);
          int64_t source = -1;
          for (int64_t s = 0; s <= t; ++s) {
            if (!optimizer.refresh_due(j, s)) continue;
            int64_t next = s + 1;
            while (!optimizer.refresh_due(j, next)) ++next;
            const int64_t installed = s == 0 ? 0 : std::min(s + own, next);
            if (installed <= t) source = s;
          }
          REQUIRE(source >= 0);
          const bool right = matrices[j].second[0] >= matrices[j].second[1];
          Tensor expected = Tensor::empty(
              right ? Shape{6, matrices[j].second[1]} : Shape{matrices[j].second[0], 6},
              DType::f32);
          settings.rank = 6;
          galore_projector(expected, grads[matrices[j].first][size_t(source)], matrices[j].second,
                           settings, seed_of(matrices[j].first, source), local_collectives(),
                           scratch);
          INFO("gap " << gap << " step " << t << " matrix " << j << " from step " << source);
          CHECK(equal(projector_of(optimizer, matrices[j].first), expected));
          installs += source > 0 && source + std::min(own, gap) == t;
        }
      }
      CHECK(installs > 0);

      // A save completes the refreshes in flight: each matrix then holds the projector of its
      // latest start.
      optimizer.before_save();
      const int64_t last = 3 * gap + 11;
      for (size_t j = 0; j < matrices.size(); ++j) {
        int64_t s = last;
        while (!optimizer.refresh_due(j, s)) --s;
        const bool right = matrices[j].second[0] >= matrices[j].second[1];
        Tensor expected = Tensor::empty(
            right ? Shape{6, matrices[j].second[1]} : Shape{matrices[j].second[0], 6}, DType::f32);
        galore_projector(expected, grads[matrices[j].first][size_t(s)], matrices[j].second,
                         settings, seed_of(matrices[j].first, s), local_collectives(), scratch);
        CHECK(equal(projector_of(optimizer, matrices[j].first), expected));
      }
    }
}
