// zero grads -> forward/backward per micro-batch -> global norm, clip -> the health monitor's
// verdict -> the optimizer (applied by the parameter provider: at once, or unit by unit beside
// the next forward).
#include "train/train_step.h"

#include <algorithm>

#include "monitor/metrics.h"

namespace frugal {

namespace {

// Sums a tensor over `comm`, or over `host_comm` when it lives in host memory (NCCL sums device
// memory only: tensors the optimizer keeps on the host under offload go over MPI).
std::function<void(Tensor&)> sum_over(Comm* comm, Comm* host_comm) {
  if (!comm) return [](Tensor&) {};
  if (!host_comm) host_comm = comm;
  return [comm, host_comm](Tensor& t) {
    Comm& over = t.device() == Device::cpu ? *host_comm : *comm;
    if (over.size() > 1) over.all_reduce_sum(t)->wait();
  };
}

}  // namespace

NothingToTrain::NothingToTrain(int64_t step, size_t micro_batches, int ranks)
    : Error(detail::concat("train step ", step, ": every target of the global batch (",
                           micro_batches, " micro-batch", micro_batches == 1 ? "" : "es",
                           " on each of ", ranks, " rank", ranks == 1 ? "" : "s",
                           ") is masked out of the loss: nothing to train")),
      step(step) {}

StepCollectives step_collectives(const StepComms& comms) {
  Comm* shard = comms.shard ? comms.shard : comms.world;
  if (!shard) return local_collectives();
  StepCollectives c;
  c.sum = [shard](double local) { return shard->all_reduce_sum(local); };
  c.sum_in_place = sum_over(shard, comms.host_shard);
  c.replicas = comms.replica ? comms.replica->size() : 1;
  c.replica_sum_in_place = sum_over(c.replicas > 1 ? comms.replica : nullptr, comms.host_replica);
  return c;
}

StepCollectives step_collectives(Comm* comm, Comm* host_comm) {
  return step_collectives(StepComms{comm, comm, nullptr, host_comm, nullptr});
}

StepResult train_step(LlamaModel& model, ParameterProvider& params, Optimizer& optimizer,
                      const std::vector<Batch>& micro_batches, Comm* comm, double lr, int64_t step,
                      CheckpointPolicy policy, Comm* host_comm, const StepHooks& hooks) {
  return train_step(model, params, optimizer, micro_batches,
                    StepComms{comm, comm, nullptr, host_comm, nullptr}, lr, step, policy, hooks);
}

StepResult train_step(LlamaModel& model, ParameterProvider& params, Optimizer& optimizer,
                      const std::vector<Batch>& micro_batches, const StepComms& comms, double lr,
                      int64_t step, CheckpointPolicy policy, const StepHooks& hooks,
                      PerLayerUpdates* per_layer) {
  StepCollectives collectives = step_collectives(comms);
  collectives.gradient_pass = hooks.gradient_pass;
  // The token count and the loss: over every rank.
  Comm* world = comms.world;
  const auto global_sum = [world](double local) {
    return world ? world->all_reduce_sum(local) : local;
  };
  int64_t local_tokens = 0;
  for (const Batch& b : micro_batches) local_tokens += counted_targets(b.targets);
  StepResult result;
  // Each trained target is on one rank only: cp ranks hold disjoint parts of a sequence (their
  // padding masked), dp ranks different sequences.
  result.tokens = static_cast<int64_t>(global_sum(double(local_tokens)));
  if (result.tokens == 0) {
    // Every rank knows the same count: all throw here, before any collective of the step.
    params.wait_for_updates();  // the previous step's, if they run beside the forward
    throw NothingToTrain(step, micro_batches.size(), world ? world->size() : 1);
  }
  // Each rank scales by the GLOBAL token count, so that summing the ranks' gradients (the
  // reduce-scatter) gives the gradient of the global mean loss.
  const float grad_scale = 1.0f / float(result.tokens);

  const double start = now_seconds();
  if (per_layer) params.wait_for_updates();  // (none: per-layer updates run without offload)
  params.zero_grads();
  double loss_sum = 0;
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    model.set_noise(uint64_t(step) * 4096 + m + 1);  // a dropout mask per micro-batch
    const bool last = m + 1 == micro_batches.size();
    params.begin_micro_batch(last);
    if (per_layer && last) {
      // The units' updates run inside this backward, as each unit's gradients become final; a
      // tied embedding's come in twice (the head's, then its own at the end): it waits for both.
      std::vector<int64_t> final_at_end;
      if (model.config().tie_word_embeddings) final_at_end.push_back(embed_unit());
      per_layer->begin_step(params, optimizer, lr, step, collectives, std::move(final_at_end),
                            hooks.before_unit_update);
      try {
        loss_sum += model.forward_backward(micro_batches[m], params, grad_scale, policy);
      } catch (...) {
        per_layer->abandon_step();
        throw;
      }
    } else {
      loss_sum += model.forward_backward(micro_batches[m], params, grad_scale, policy);
    }
  }
  model.set_noise(0);
  const double backward_end = now_seconds();
  result.forward_backward_seconds = backward_end - start;
  result.loss = global_sum(loss_sum) / double(result.tokens);
  if (per_layer) {
    const PerLayerReport report = per_layer->finish_step();
    result.grad_norm = report.grad_norm;
    result.units_updated = report.units_updated;
    result.units = report.units;
    result.first_nonfinite_unit = report.first_nonfinite_unit;
    // The health record's pass over the gradients (a log step's), which the norm did not take:
    // the shards still hold the step's gradients.
    if (hooks.gradient_pass) {
      std::vector<Tensor> grads;
      for (const TrainableShard& s : params.trainable()) grads.push_back(s.grad);
      hooks.gradient_pass(grads);
    }
    const bool accepted = !hooks.accept || hooks.accept(result);
    result.applied = accepted && report.units_updated == report.units;
    result.partly_applied = report.units_updated > 0 && report.units_updated < report.units;
    result.optimizer_seconds = 0;  // inside the backward
    return result;
  }
  // optim.update = step.
  // The previous step's updates are done by now (the forward gathered every unit); waiting
  // makes it certain before the optimizer's step state changes.
  params.wait_for_updates();
  if (hooks.after_backward) hooks.after_backward();
  result.grad_norm = optimizer.begin_step(lr, step, collectives).grad_norm;
  result.applied = !hooks.accept || hooks.accept(result);
  if (result.applied)
    params.apply_update(optimizer.slices(), [&optimizer](size_t k) { optimizer.update(k); });
  result.optimizer_seconds = now_seconds() - backward_end;
  return result;
}

}  // namespace frugal
