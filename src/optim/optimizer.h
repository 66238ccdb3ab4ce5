// What the step loop and the checkpoint manager ask of an optimizer. A step is two halves:
// begin_step, on the main thread, does every collective the step needs (the global gradient
// norm, GaLore's refreshes and projections: MPI runs FUNNELED), then update(k) changes slice k
// alone, so that ZeRO-3 with a host optimizer may run the updates on a thread
// of its own beside the next forward. Per-layer updates (optim.update = per_layer) split the
// step by unit instead: begin_per_layer_step, then for each unit as its gradients become final
// in the backward, begin_slices (that unit's collectives) and update(k) of its slices. Its state
// (moments, projectors) is named tensors, each row-sharded like its parameter or replicated, which
// checkpoints save without knowing them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/stateful.h"
#include "core/tensor.h"

namespace frugal {

// The collectives of a step among the ranks that hold parts of the gradients (MPI or NCCL
// all-reduces under ZeRO-3; identities on one rank). train/ makes them from its communicators;
// optim/ knows no communicator.
struct StepCollectives {
  // The sum of a rank-local value over the ranks.
  std::function<double(double)> sum;
  // Replaces a tensor (f32, on any device) by its element-wise sum over the ranks.
  std::function<void(Tensor&)> sum_in_place;
  // Hybrid sharding: the replicas holding the same rows (1: none; `sum` and `sum_in_place` are
  // then over one replica's ranks, whose gradient shards the replicas have already summed), and
  // the in-place sum over them of a tensor made from gradients they have not (GaLore's
  // projections, with parallel.replica_galore_projection). The identity without replicas.
  int replicas = 1;
  std::function<void(Tensor&)> replica_sum_in_place;
  // The pass over this rank's gradients that the global norm takes: ops::sum_squares when
  // empty; on a log step the health monitor's, which counts non-finite and bf16-cast values in
  // the same pass and returns the same sum bit for bit (train/health_monitor.h).
  std::function<double(const std::vector<Tensor>&)> gradient_pass;
  double local_sum_squares(const std::vector<Tensor>& grads) const;
};
// The collectives of one rank alone: the identities.
StepCollectives local_collectives();

// A grad_norm that is not finite (a NaN or an inf in some rank's gradients) changes no state
// in begin_step beyond the step's scalars: the caller skips the updates of that step.
struct StepReport {
  double grad_norm = 0;   // before clipping
  double clip_scale = 1;  // factor applied to the gradients
};

class Optimizer : public Stateful {
 public:
  // The collectives and per-step scalars of step `step` (1-based) at learning rate `lr`.
  virtual StepReport begin_step(double lr, int64_t step, const StepCollectives& collectives) = 0;
  // Updates trainable slice k (ParameterProvider::trainable()'s order), touching only its
  // tensors; after begin_step.
  virtual void update(size_t k) = 0;
  virtual size_t slices() const = 0;
  // Where the optimizer's device time went since the last call, for the metrics (null when it
  // does not measure it).
  virtual nlohmann::json take_profile() { return nullptr; }

  // Per-layer updates (train/per_layer_updates.h). The step's scalars (no norm: the caller
  // knows the gradients a unit at a time), then, for each unit as its gradients become final,
  // what begin_step does for those slices alone: the collectives they need (GaLore's refreshes
  // and projections; every rank names the same units in the same order) with `clip_scale`
  // applied to their gradients. update(k) of those slices follows. With clip_scale 1 the
  // updates equal step()'s with clipping off (GaLore's sums over the ranks are then per unit
  // instead of one for all units: the same terms, summed alike element by element).
  virtual void begin_per_layer_step(double lr, int64_t step) = 0;
  virtual void begin_slices(const std::vector<size_t>& slices, double clip_scale,
                            const StepCollectives& collectives) = 0;

  // begin_step, then every update, in order.
  StepReport step(double lr, int64_t step, const StepCollectives& collectives) {
    const StepReport report = begin_step(lr, step, collectives);
    for (size_t k = 0; k < slices(); ++k) update(k);
    return report;
  }
};

}  // namespace frugal
