// Per-layer updates (optim.update = per_layer, train/per_layer_updates.h) on 1 to 8 ranks of
// ZeRO-3: with clipping off they equal the ordinary step bit for bit (AdamW, LoRA and GaLore,
// whose sums over the ranks run per unit instead of in one buffer), over
// gradient accumulation and tied embeddings; a run stopped at step k and resumed from its state
// equals one that ran through; and a unit with non-finite gradients stops the updates of the
// units after it, while those before it keep theirs.
#include <cmath>
#include <memory>

#include "catch_compat.h"
#include "model/llama_model.h"
#include "model/lora.h"
#include "model_support.h"
#include "optim/adamw.h"
#include "optim/galore_adamw.h"
#include "parallel/comm.h"
#include "parallel/zero3_parameters.h"
#include "train/per_layer_updates.h"
#include "train/train_step.h"

using namespace frugal;

namespace {

LlamaConfig odd_config(bool tied) {
  LlamaConfig c;
  c.hidden_size = 48;
  c.intermediate_size = 70;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.vocab_size = 37;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  return c;
}

enum class Opt { adamw, galore };

GaloreConfig galore_config() {
  GaloreConfig g;
  g.refresh = GaloreRefresh::immediate;  // per-layer updates refresh inline
  g.projector.kind = GaloreProjectorKind::randomized;
  g.projector.rank = 4;
  g.projector.oversampling = 2;
  g.update_proj_gap = 2;  // refreshes at steps 1 and 3 of every matrix, staggered between
  g.scale = 0.5;
  g.seed = 7;
  return g;
}

// A model's ZeRO-3 parameters and optimizer, with arenas of their own.
struct Trainee {
  Arena params_arena{"test params", Device::cpu}, grads_arena{"test grads", Device::cpu},
      gathered_arena{"test gathered", Device::cpu}, optim_arena{"test optim", Device::cpu};
  std::unique_ptr<Zero3Parameters> params;
  std::unique_ptr<Optimizer> optimizer;

  Trainee(const std::vector<UnitSpec>& units, Comm& comm, Opt opt, double grad_clip) {
    params = std::make_unique<Zero3Parameters>(
        units, comm, Zero3Arenas{&params_arena, &grads_arena, &gathered_arena}, 5, 0.05f);
    // eps well above the rounding noise of near-zero gradients (see test_zero3.cpp).
    const AdamWConfig adamw{0.9, 0.95, 1e-6, 0.1, grad_clip};
    if (opt == Opt::galore)
      optimizer =
          std::make_unique<GaloreAdamW>(params->trainable(), adamw, galore_config(), optim_arena);
    else
      optimizer = std::make_unique<AdamW>(params->trainable(), adamw, optim_arena);
  }
};

int64_t global_batch(int ranks) { return ranks * ((4 + ranks - 1) / ranks); }

// This rank's micro-batches of step `step`: `micro` of them, slices of the same global batches.
std::vector<Batch> rank_batches(Comm& comm, int64_t step, int64_t micro) {
  const int64_t global = global_batch(comm.size()), per_rank = global / comm.size();
  std::vector<Batch> out;
  for (int64_t m = 0; m < micro; ++m)
    out.push_back(test::slice_of_random_batch(uint32_t(1000 * step + m), global, 13, 37,
                                              comm.rank() * per_rank, per_rank, 7));
  return out;
}

StepResult run_step(LlamaModel& model, Trainee& t, Comm& comm, int64_t step, int64_t micro,
                    PerLayerUpdates* per_layer, const StepHooks& hooks = {}) {
  return train_step(model, *t.params, *t.optimizer, rank_batches(comm, step, micro),
                    StepComms{&comm, &comm, nullptr, nullptr, nullptr}, 1e-2, step,
                    CheckpointPolicy::selective, hooks, per_layer);
}

// Every unit's weights, gathered (a collective).
std::vector<std::vector<float>> all_weights(ParameterProvider& params, size_t units) {
  std::vector<std::vector<float>> out;
  for (size_t u = 0; u < units; ++u) {
    std::vector<float> values;
    for (const Tensor& w : params.gather(int64_t(u)))
      values.insert(values.end(), w.data<float>(), w.data<float>() + w.numel());
    params.release(int64_t(u));
    out.push_back(std::move(values));
  }
  return out;
}

double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i)
    largest = std::max(largest, std::abs(double(a[i]) - double(b[i])));
  return largest;
}

// Three steps of `micro` micro-batches each way, clipping off: per-layer updates against the
// ordinary step on the same ranks.
void check_same_as_step(const std::vector<UnitSpec>& units, const LlamaConfig& config,
                        const LoraConfig* lora, Opt opt, int64_t micro, double tolerance) {
  auto comm = make_mpi_world_comm(60);
  LlamaModel model(config);
  if (lora) model.set_lora(lora);
  Trainee step_run(units, *comm, opt, 0), per_layer_run(units, *comm, opt, 0);
  PerLayerUpdates per_layer(PerLayerClip::none, 0);
  for (int64_t step = 1; step <= 3; ++step) {
    const StepResult a = run_step(model, step_run, *comm, step, micro, nullptr);
    const StepResult b = run_step(model, per_layer_run, *comm, step, micro, &per_layer);
    INFO("step " << step << " on " << comm->size() << " ranks");
    CHECK(b.loss == a.loss);  // the same weights so far
    // The norm: the units' squared norms summed over the ranks and then over the units, instead
    // of over the slices and then the ranks (doubles: a few ulps).
    CHECK(b.grad_norm == Approx(a.grad_norm).epsilon(1e-12));
    CHECK(b.applied);
    CHECK(b.units_updated == b.units);
  }
  const auto wa = all_weights(*step_run.params, units.size());
  const auto wb = all_weights(*per_layer_run.params, units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    INFO("unit " << u << " on " << comm->size() << " ranks");
    if (tolerance == 0)
      CHECK(wa[u] == wb[u]);
    else
      CHECK(largest_difference(wa[u], wb[u]) <= tolerance);
  }
}

}  // namespace

TEST_CASE("per-layer AdamW updates equal the ordinary step bit for bit", "[per_layer][mpi]") {
  // Two micro-batches (updates only in the second), untied and tied embeddings (the tied one's
  // gradients come in twice: it updates at the end).
  for (bool tied : {false, true}) {
    const LlamaConfig config = odd_config(tied);
    check_same_as_step(llama_units(config), config, nullptr, Opt::adamw, 2, 0);
  }
}

TEST_CASE("per-layer LoRA updates equal the ordinary step bit for bit", "[per_layer][lora][mpi]") {
  const LlamaConfig config = odd_config(false);
  LoraConfig lora;
  lora.rank = 3;
  lora.alpha = 6;
  lora.targets = lora_targets_from_names("q_proj,v_proj,down_proj");
  check_same_as_step(lora_units(config, lora), config, &lora, Opt::adamw, 1, 0);
}

TEST_CASE("per-layer GaLore updates equal the ordinary step", "[per_layer][galore][mpi]") {
  // The refreshes' and left projections' sums over the ranks run per unit instead of for all
  // units at once: the same terms element by element, summed in the same order by Open MPI's
  // all-reduce at these sizes (bit for bit on 1 to 8 ranks). A library that picks another
  // algorithm (another order of the ranks' terms) for another message size would differ by fp32
  // rounding.
  const LlamaConfig config = odd_config(false);
  check_same_as_step(llama_units(config), config, nullptr, Opt::galore, 2, 0);
}

TEST_CASE("per-layer updates resume exactly", "[per_layer][mpi]") {
  // previous_norm's clipping factor comes from the last step's norm: a resume that lost it would
  // not clip its first step. grad_clip 0.05 is below this model's norms, so every step clips.
  for (Opt opt : {Opt::adamw, Opt::galore}) {
    for (PerLayerClip clip : {PerLayerClip::previous_norm, PerLayerClip::unit}) {
      auto comm = make_mpi_world_comm(60);
      const LlamaConfig config = odd_config(false);
      const std::vector<UnitSpec> units = llama_units(config);
      LlamaModel model(config);
      Trainee through(units, *comm, opt, 0.05), first(units, *comm, opt, 0.05);
      PerLayerUpdates through_updates(clip, 0.05), first_updates(clip, 0.05);
      for (int64_t step = 1; step <= 4; ++step)
        run_step(model, through, *comm, step, 1, &through_updates);
      for (int64_t step = 1; step <= 2; ++step)
        run_step(model, first, *comm, step, 1, &first_updates);
      // The state a checkpoint saves (weights, optimizer tensors and values, the per-layer
      // values), into a fresh run.
      Trainee resumed(units, *comm, opt, 0.05);
      PerLayerUpdates resumed_updates(clip, 0.05);
      const std::vector<TrainableShard> from = first.params->trainable();
      std::vector<TrainableShard> to = resumed.params->trainable();
      for (size_t k = 0; k < from.size(); ++k) to[k].param.copy_from(from[k].param);
      const std::vector<StateTensor> state_from = first.optimizer->state_tensors();
      const std::vector<StateTensor> state_to = resumed.optimizer->state_tensors();
      REQUIRE(state_from.size() == state_to.size());
      for (size_t i = 0; i < state_from.size(); ++i) {
        Tensor t = state_to[i].tensor;
        t.copy_from(state_from[i].tensor);
      }
      resumed.optimizer->load_state_values(first.optimizer->state_values());
      resumed_updates.load_state_values(first_updates.state_values());
      for (int64_t step = 3; step <= 4; ++step)
        run_step(model, resumed, *comm, step, 1, &resumed_updates);
      const auto wa = all_weights(*through.params, units.size());
      const auto wb = all_weights(*resumed.params, units.size());
      INFO((opt == Opt::galore ? "galore" : "adamw")
           << ", " << enum_name(clip) << ", " << comm->size() << " ranks");
      for (size_t u = 0; u < units.size(); ++u) CHECK(wa[u] == wb[u]);
    }
  }
}

TEST_CASE("a non-finite unit stops the per-layer updates after it", "[per_layer][health][mpi]") {
  auto comm = make_mpi_world_comm(60);
  const LlamaConfig config = odd_config(false);
  const std::vector<UnitSpec> units = llama_units(config);
  LlamaModel model(config);
  Trainee t(units, *comm, Opt::adamw, 1.0);
  PerLayerUpdates per_layer(PerLayerClip::unit, 1.0);
  run_step(model, t, *comm, 1, 1, &per_layer);
  const auto before = all_weights(*t.params, units.size());
  // NaN in layers.1's first gradient, on rank 0 only: the backward finishes the head, then
  // layers.2, then layers.1 (whose norm over the ranks is NaN on every rank).
  const int64_t bad = block_unit(1);
  StepHooks hooks;
  hooks.before_unit_update = [&](const std::vector<size_t>& slices) {
    std::vector<TrainableShard> shards = t.params->trainable();
    if (comm->rank() == 0 && shards[slices[0]].unit == bad)
      ops::scale_inplace(shards[slices[0]].grad, std::numeric_limits<float>::quiet_NaN());
  };
  const StepResult r = run_step(model, t, *comm, 2, 1, &per_layer, hooks);
  CHECK_FALSE(std::isfinite(r.grad_norm));
  CHECK_FALSE(r.applied);
  CHECK(r.partly_applied);
  CHECK(r.first_nonfinite_unit == bad);
  CHECK(r.units == int64_t(units.size()));
  CHECK(r.units_updated == 2);  // the head and layers.2
  const auto after = all_weights(*t.params, units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    INFO("unit " << u);
    for (float v : after[u]) REQUIRE(std::isfinite(v));
    if (int64_t(u) > bad)
      CHECK(after[u] != before[u]);  // updated before the NaN was seen
    else
      CHECK(after[u] == before[u]);  // the NaN unit and those after it: untouched
  }
  // The next step is whole again.
  const StepResult next = run_step(model, t, *comm, 3, 1, &per_layer);
  CHECK(next.applied);
  CHECK(next.units_updated == next.units);
  CHECK(std::isfinite(next.grad_norm));
}
