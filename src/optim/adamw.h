// AdamW over the trainable shards a rank owns, with global-norm clipping. The moments live
// in the arena the caller names (host memory, or an offload arena).
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"
#include "model/parameter_provider.h"
#include "ops/ops.h"
#include "optim/optimizer.h"

namespace frugal {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip = 1.0;  // 0: no clipping
  // The moments' dtype (optim.state_dtype); unset, the master's (fp32, or bf16 in a bf16 run).
  std::optional<DType> moments = std::nullopt;
  // How updates are stored into bf16 masters (optim.bf16_rounding): stochastically, with bits
  // keyed by (rounding_seed, step, the parameter's name, the element's index in the whole
  // parameter), or to nearest even. fp32 masters ignore both.
  bool bf16_stochastic = true;
  uint64_t rounding_seed = 0;
  // optim.state_dtype = int8: the moments of the matrices int8_moments_apply() names are 8-bit
  // (optim/quantized_moments.h: bitsandbytes' AdamW8bit); the rest keep `moments`.
  bool int8_state = false;
  // bitsandbytes' min_8bit_size: a tensor of fewer values keeps 32-bit moments (tests lower it
  // to quantize small matrices).
  int64_t int8_min_elements = 4096;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<TrainableShard> shards, const AdamWConfig& config,
        Arena& state_arena = host_arena());

  // The global norm and the clipping factor (a collective), kept with lr and step for update(k),
  // which updates shard k alone.
  StepReport begin_step(double lr, int64_t step, const StepCollectives& collectives) override;
  void update(size_t k) override;
  size_t slices() const override { return shards_.size(); }
  // Per-layer updates: AdamW's update of a slice needs no collective; the clipping factor is
  // the caller's, per unit.
  void begin_per_layer_step(double lr, int64_t step) override;
  void begin_slices(const std::vector<size_t>& slices, double clip_scale,
                    const StepCollectives& collectives) override;
  using Optimizer::step;

  // The moments, "optim/exp_avg/<name>" and "optim/exp_avg_sq/<name>", in their shard's rows
  // (8-bit ones as "<that name>.codes" and "<that name>.absmax", quantized_moments.h).
  std::vector<StateTensor> state_tensors() override;

 private:
  std::vector<TrainableShard> shards_;
  AdamWConfig config_;
  std::vector<Tensor> m_, v_;                  // undefined where 8-bit
  std::vector<ops::QuantizedMoment> qm_, qv_;  // the 8-bit ones (codes undefined elsewhere)
  // What begin_step decided for this step's updates.
  double lr_ = 0, clip_scale_ = 1;
  int64_t step_ = 0;
};

// Whether weight decay applies to a parameter: matrices yes, norm weights no.
bool decays(const std::string& name);

// How optimizer step `step` stores its updates of shard s into a bf16 master (unused by fp32
// ones): the rounding the config asks for, keyed by the parameter's name and the shard's first
// element in the whole parameter, so any sharding rounds each element alike.
Bf16Store bf16_store(const AdamWConfig& config, const TrainableShard& s, int64_t step);

// The scalars of one AdamW update of parameter `name` (GaLore's optimizer updates the
// parameters it does not project with them too).
ops::AdamWStep adamw_step(const AdamWConfig& config, const std::string& name, double lr,
                          int64_t step, double clip_scale);

}  // namespace frugal
