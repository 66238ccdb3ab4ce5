// Per-layer updates (optim.update = per_layer): each unit's optimizer update runs in the
// backward of the step's last micro-batch, as soon as the unit's gradients are final (ZeRO-3:
// its reduce-scatter done; one rank: its grads_done), instead of after the whole backward.
//
// Why: the update of unit u no longer waits for units below it, and nothing in the update needs
// the whole model's gradient at once (per unit: its norm, its clipping, GaLore's projections).
// What it does NOT save today: frugal's gradient shards are allocated once for every unit
// (ZeRO-3's 1/N of the model, the whole model on one rank) and outlive the step, because
// gradient accumulation adds into them over the micro-batches and the optimizers hold them;
// the memory plan (src/plan/) therefore counts them as before.
//
// Clipping (optim.per_layer_clip): the global norm is known only after the last unit's update.
//   unit           each unit's gradient is clipped to grad_clip / sqrt(U) (U: the units with
//                  trainable slices) by its own norm, so the global norm after clipping is at
//                  most grad_clip; exact and stateless, and a spike is clipped in the step it
//                  happens.
//   previous_norm  every unit takes the factor global clipping would take from the PREVIOUS
//                  step's global norm (none at the first step); checkpointed for exact resume.
//   none           no clipping.
// With optim.grad_clip = 0 all three clip nothing.
//
// Health: a unit whose gradients hold a NaN or an inf (its norm, summed over the ranks, is not
// finite: every rank sees the same) is not updated, and neither is any unit after it in the
// step: units already updated keep their (finite) updates, the step is reported partly applied
// with a non-finite norm, and the health monitor's verdict for non-finite steps (skip count,
// monitor.max_skipped_steps, a rollback with monitor.on_divergence = rollback) follows as for an
// ordinary step.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "config/train_config.h"
#include "core/stateful.h"
#include "model/parameter_provider.h"
#include "optim/optimizer.h"

namespace frugal {

// What a step's per-layer updates did.
struct PerLayerReport {
  double grad_norm = 0;       // sqrt of the units' squared norms (not finite if a unit's is not)
  int64_t units_updated = 0;  // units with trainable slices that were updated
  int64_t units = 0;          // units with trainable slices
  int64_t first_nonfinite_unit = -1;
};

class PerLayerUpdates : public Stateful {
 public:
  PerLayerUpdates(PerLayerClip clip, double grad_clip) : clip_(clip), grad_clip_(grad_clip) {}

  // Before the backward of the step's last micro-batch: registers with `params` to hear of each
  // unit's final gradients and begins the optimizer's per-layer step. Units in `final_at_end`
  // (a tied embedding, whose gradients come in twice) update in finish_step.
  // `before_unit_update`: a testing aid that may damage a unit's slices' gradients first.
  void begin_step(ParameterProvider& params, Optimizer& optimizer, double lr, int64_t step,
                  const StepCollectives& collectives, std::vector<int64_t> final_at_end,
                  std::function<void(const std::vector<size_t>&)> before_unit_update = {});
  // After the backward: the deferred units, unregistering from the provider; every unit with
  // trainable slices has been updated or skipped.
  PerLayerReport finish_step();
  // Unregisters without finishing (the backward threw).
  void abandon_step();

  // previous_norm's state: the last step's global norm.
  nlohmann::json state_values() const override;
  void load_state_values(const nlohmann::json& values) override;

 private:
  void unit_final(int64_t unit);
  double clip_scale(double unit_norm) const;

  PerLayerClip clip_;
  double grad_clip_;
  double previous_norm_ = 0;  // 0: none yet (the first step clips nothing)

  // The step in progress.
  ParameterProvider* params_ = nullptr;
  Optimizer* optimizer_ = nullptr;
  StepCollectives collectives_;
  std::function<void(const std::vector<size_t>&)> before_unit_update_;
  std::vector<std::vector<size_t>> slices_of_;  // by unit: its trainable slices
  std::vector<std::vector<Tensor>> grads_of_;   // by unit: their gradients
  std::vector<bool> done_;                      // by unit: updated or skipped this step
  std::vector<int64_t> final_at_end_;
  double sum_squares_ = 0;
  PerLayerReport report_;
  bool stopped_ = false;  // a non-finite unit: the units after it are skipped
};

}  // namespace frugal
