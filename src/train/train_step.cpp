// zero grads -> forward/backward per micro-batch -> global norm, clip -> the health monitor's
// verdict -> the optimizer (applied by the parameter provider: at once, or unit by unit beside
// the next forward).
#include "train/train_step.h"

#include <algorithm>

#include "monitor/metrics.h"

namespace frugal {

StepCollectives step_collectives(Comm* comm, Comm* host_comm) {
  if (!comm) return local_collectives();
  if (!host_comm) host_comm = comm;
  StepCollectives c;
  c.sum = [comm](double local) { return comm->all_reduce_sum(local); };
  // NCCL sums device memory only: tensors the optimizer keeps on the host (offload) go over
  // MPI, among the same ranks.
  c.sum_in_place = [comm, host_comm](Tensor& t) {
    Comm& over = t.device() == Device::cpu ? *host_comm : *comm;
    if (over.size() > 1) over.all_reduce_sum(t)->wait();
  };
  return c;
}

StepResult train_step(LlamaModel& model, ParameterProvider& params, Optimizer& optimizer,
                      const std::vector<Batch>& micro_batches, Comm* comm, double lr, int64_t step,
                      CheckpointPolicy policy, Comm* host_comm, const StepHooks& hooks) {
  StepCollectives collectives = step_collectives(comm, host_comm);
  collectives.gradient_pass = hooks.gradient_pass;
  const auto& global_sum = collectives.sum;
  int64_t local_tokens = 0;
  for (const Batch& b : micro_batches) local_tokens += counted_targets(b.targets);
  StepResult result;
  result.tokens = static_cast<int64_t>(global_sum(double(local_tokens)));
  // Each rank scales by the GLOBAL token count, so that summing the ranks' gradients (the
  // reduce-scatter) gives the gradient of the global mean loss.
  const float grad_scale = 1.0f / float(std::max<int64_t>(1, result.tokens));

  const double start = now_seconds();
  params.zero_grads();
  double loss_sum = 0;
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    model.set_noise(uint64_t(step) * 4096 + m + 1);  // a dropout mask per micro-batch
    loss_sum += model.forward_backward(micro_batches[m], params, grad_scale, policy);
  }
  model.set_noise(0);
  const double backward_end = now_seconds();
  result.forward_backward_seconds = backward_end - start;
  result.loss = global_sum(loss_sum) / double(std::max<int64_t>(1, result.tokens));
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
