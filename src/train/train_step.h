// One optimizer step over a list of micro-batches, on any ParameterProvider and any number
// of data-parallel and cp ranks: the loss and its gradients are the mean over every trained
// (unmasked) target of the global batch, whatever its split into ranks and micro-batches.
#pragma once

#include <functional>
#include <vector>

#include "core/error.h"
#include "model/llama_model.h"
#include "optim/optimizer.h"
#include "parallel/comm.h"
#include "train/per_layer_updates.h"

namespace frugal {

struct StepResult {
  double loss = 0;       // mean over the global batch's trained targets
  int64_t tokens = 0;    // trained (unmasked) targets of the global batch: every rank's, once
  double grad_norm = 0;  // before clipping
  // Wall time of the forward and backward passes of every micro-batch (up to the last loss
  // read back, so a GPU's work included) and of the optimizer (global norm, clipping, AdamW).
  // With the optimizer on the host (offload), the AdamW updates run during the next step's
  // forward (ParameterProvider::apply_update): optimizer_seconds is then the norm's, and the
  // wait for updates not yet done shows in the next forward_backward_seconds.
  double forward_backward_seconds = 0;
  double optimizer_seconds = 0;
  bool applied = true;  // false when StepHooks::accept refused the step (no update was made)
  // Per-layer updates: some units were updated before a unit with non-finite gradients stopped
  // the rest (applied is then false: the step counts as skipped, though not wholly).
  bool partly_applied = false;
  int64_t units_updated = 0, units = 0;  // per-layer updates: of the units with trainable slices
  int64_t first_nonfinite_unit = -1;     // per-layer updates: the unit that stopped them
};

// What the health monitor (health_monitor.h) and the fault injection add to a step; every
// member may be empty.
struct StepHooks {
  // The pass over this rank's gradients that the norm takes (StepCollectives::gradient_pass).
  std::function<double(const std::vector<Tensor>&)> gradient_pass;
  // After the backward, before the norm: a testing aid that damages the gradients.
  std::function<void()> after_backward;
  // The same under per-layer updates, for a unit's slices (trainable()'s numbering) as their
  // gradients become final, before the unit's norm and update.
  std::function<void(const std::vector<size_t>& slices)> before_unit_update;
  // With the step's loss and norm, before any update: false skips the step's updates (the
  // optimizer's state and the weights stay as they were). Called on every rank, with the same
  // loss and norm, so every rank decides alike. Under per-layer updates it comes after them:
  // its verdict counts the step (non-finite, spike) but undoes nothing.
  std::function<bool(const StepResult&)> accept;
};

// The ranks a step sums over (nullptr: this rank alone, or none).
struct StepComms {
  Comm* world = nullptr;    // every rank: the token count and the loss
  Comm* shard = nullptr;    // the ranks holding different rows of the state (ZeRO-3's); null: world
  Comm* replica = nullptr;  // hybrid sharding: the ranks holding the same rows in other replicas
  // MPI groups of the same ranks as `shard` and `replica`, for host tensors beside NCCL ones
  // (offload); null: `shard` and `replica` themselves.
  Comm* host_shard = nullptr;
  Comm* host_replica = nullptr;
};

// The optimizer's collectives: sums over the shard group, and over the replicas.
StepCollectives step_collectives(const StepComms& comms);
// Over `comm` (nullptr: this rank alone). Host tensors go over `host_comm` when it is given: an
// MPI world beside an NCCL `comm`, among the same ranks.
StepCollectives step_collectives(Comm* comm, Comm* host_comm = nullptr);

// What train_step throws, on every rank alike, when no target of the global batch is trained
// (every one masked on every rank): a mean over no targets has no value, and an update from a
// zero gradient would still move the weights (AdamW's momentum and decay) as if it had
// trained. Nothing changes: the parameters and the optimizer's state stay as they were. The
// message names the step; a caller that knows where the batch came from may catch this type
// and say so.
class NothingToTrain : public Error {
 public:
  NothingToTrain(int64_t step, size_t micro_batches, int ranks);
  int64_t step;
};

// The loss is the sum of the token losses of every rank's micro-batches over the GLOBAL count
// of trained targets (StepComms::world), and each rank scales its gradients by 1 / that count,
// so that the sums over the shard group and the replicas give the gradient of that mean.
// Throws NothingToTrain when that count is 0. With `per_layer` (optim.update = per_layer) the
// updates run unit by unit in the backward of the last micro-batch (per_layer_updates.h).
StepResult train_step(LlamaModel& model, ParameterProvider& params, Optimizer& optimizer,
                      const std::vector<Batch>& micro_batches, const StepComms& comms, double lr,
                      int64_t step, CheckpointPolicy policy, const StepHooks& hooks = {},
                      PerLayerUpdates* per_layer = nullptr);
// `comm` sums across data-parallel ranks (ZeRO-3 over all of them); nullptr means this rank
// alone. `host_comm`: as for step_collectives.
StepResult train_step(LlamaModel& model, ParameterProvider& params, Optimizer& optimizer,
                      const std::vector<Batch>& micro_batches, Comm* comm, double lr, int64_t step,
                      CheckpointPolicy policy, Comm* host_comm = nullptr,
                      const StepHooks& hooks = {});

}  // namespace frugal
