// AdamW over shards: global norm, clip, update.
#include "optim/adamw.h"

#include <cmath>

#include "ops/ops.h"
#include "optim/quantized_moments.h"

namespace frugal {

bool decays(const std::string& name) { return name.find("norm") == std::string::npos; }

AdamW::AdamW(std::vector<TrainableShard> shards, const AdamWConfig& config, Arena& state_arena)
    : shards_(std::move(shards)), config_(config) {
  // The moments take optim.state_dtype, by default the master's dtype: fp32, or bf16 in a bf16
  // run (as torch.optim.AdamW keeps them for bf16 parameters).
  for (const TrainableShard& s : shards_) {
    const DType dtype = config_.moments.value_or(s.param.dtype());
    const bool int8 =
        config_.int8_state && int8_moments_apply(s.rows.full_shape, config_.int8_min_elements);
    m_.push_back(int8 ? Tensor() : ops::zeros(s.param.shape(), dtype, state_arena));
    v_.push_back(int8 ? Tensor() : ops::zeros(s.param.shape(), dtype, state_arena));
    qm_.push_back(int8 ? int8_moment_zeros(s.param.shape(), state_arena) : ops::QuantizedMoment());
    qv_.push_back(int8 ? int8_moment_zeros(s.param.shape(), state_arena) : ops::QuantizedMoment());
  }
}

StepReport AdamW::begin_step(double lr, int64_t step, const StepCollectives& collectives) {
  std::vector<Tensor> grads;
  for (const TrainableShard& s : shards_) grads.push_back(s.grad);
  const double local = collectives.local_sum_squares(grads);
  StepReport report;
  report.grad_norm = std::sqrt(collectives.sum(local));
  if (config_.grad_clip > 0 && report.grad_norm > config_.grad_clip)
    report.clip_scale = config_.grad_clip / (report.grad_norm + 1e-6);
  lr_ = lr;
  step_ = step;
  clip_scale_ = report.clip_scale;
  return report;
}

Bf16Store bf16_store(const AdamWConfig& config, const TrainableShard& s, int64_t step) {
  Bf16Store store;
  store.stochastic = config.bf16_stochastic;
  store.key = stochastic_rounding_key(config.rounding_seed, step,
                                      parameter_rounding_id(s.name.data(), s.name.size()));
  const int64_t rows = s.rows.rows();
  const int64_t row_len = rows > 0 ? shape_numel(s.rows.full_shape) / rows : 0;
  store.first_element = s.rows.first_row * row_len;
  return store;
}

void AdamW::begin_per_layer_step(double lr, int64_t step) {
  lr_ = lr;
  step_ = step;
  clip_scale_ = 1;
}

void AdamW::begin_slices(const std::vector<size_t>&, double clip_scale, const StepCollectives&) {
  clip_scale_ = clip_scale;
}

ops::AdamWStep adamw_step(const AdamWConfig& config, const std::string& name, double lr,
                          int64_t step, double clip_scale) {
  ops::AdamWStep hyper;
  hyper.lr = static_cast<float>(lr);
  hyper.beta1 = static_cast<float>(config.beta1);
  hyper.beta2 = static_cast<float>(config.beta2);
  hyper.eps = static_cast<float>(config.eps);
  hyper.weight_decay = decays(name) ? static_cast<float>(config.weight_decay) : 0.0f;
  hyper.step = step;
  hyper.grad_scale = static_cast<float>(clip_scale);
  return hyper;
}

void AdamW::update(size_t i) {
  FRUGAL_CHECK(i < shards_.size(), "AdamW shard ", i, " of ", shards_.size());
  FRUGAL_CHECK(step_ >= 1, "AdamW::update before begin_step");
  TrainableShard& s = shards_[i];
  const ops::AdamWStep hyper = adamw_step(config_, s.name, lr_, step_, clip_scale_);
  const Bf16Store store = bf16_store(config_, s, step_);
  if (qm_[i].codes.defined())
    ops::adamw_int8_update(s.param, s.grad, qm_[i], qv_[i], hyper, s.param_copy, store);
  else
    ops::adamw_update(s.param, s.grad, m_[i], v_[i], hyper, s.param_copy, store);
}

std::vector<StateTensor> AdamW::state_tensors() {
  std::vector<StateTensor> state;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const TrainableShard& s = shards_[i];
    if (qm_[i].codes.defined()) {
      append_quantized_state(state, "optim/exp_avg/" + s.name, qm_[i], s.rows);
      append_quantized_state(state, "optim/exp_avg_sq/" + s.name, qv_[i], s.rows);
      continue;
    }
    state.push_back({"optim/exp_avg/" + s.name, m_[i], s.rows});
    state.push_back({"optim/exp_avg_sq/" + s.name, v_[i], s.rows});
  }
  return state;
}

}  // namespace frugal
