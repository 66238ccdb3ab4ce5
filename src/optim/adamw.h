// AdamW over the trainable shards a rank owns, with global-norm clipping. The moments live
// in the arena the caller names (host memory, or an offload arena).
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"
#include "model/parameter_provider.h"

namespace frugal {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip = 1.0;  // 0: no clipping
};

// Sums a rank-local value over every rank that holds part of the gradients (an MPI
// all-reduce under ZeRO-3; the identity on one rank).
using GlobalSum = std::function<double(double)>;

class AdamW {
 public:
  AdamW(std::vector<TrainableShard> shards, const AdamWConfig& config,
        Arena& state_arena = host_arena());

  struct StepReport {
    double grad_norm = 0;   // before clipping
    double clip_scale = 1;  // factor applied to the gradients
  };
  // One update with learning rate `lr`; `step` is 1-based: begin_step, then update of every
  // shard.
  StepReport step(double lr, int64_t step, const GlobalSum& global_sum);
  // The two halves of step, for callers that spread the updates out (ZeRO-3 with a host
  // optimizer updates unit by unit while the next forward runs). begin_step: the global norm
  // and the clipping factor (a collective), kept with lr and step for update(i), which updates
  // shard i alone (touching only its tensors, so that it may run on another thread).
  StepReport begin_step(double lr, int64_t step, const GlobalSum& global_sum);
  void update(size_t i);

  // State for checkpoints: moments by the shard's name.
  const std::vector<TrainableShard>& shards() const { return shards_; }
  Tensor& first_moment(size_t i) { return m_[i]; }
  Tensor& second_moment(size_t i) { return v_[i]; }

 private:
  std::vector<TrainableShard> shards_;
  AdamWConfig config_;
  std::vector<Tensor> m_, v_;
  // What begin_step decided for this step's updates.
  double lr_ = 0, clip_scale_ = 1;
  int64_t step_ = 0;
};

// Whether weight decay applies to a parameter: matrices yes, norm weights no.
bool decays(const std::string& name);

}  // namespace frugal
