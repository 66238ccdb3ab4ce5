// Whole-model parameters on one rank.
#include "model/local_parameters.h"

namespace frugal {

LocalParameters::LocalParameters(const LlamaConfig& config, uint64_t seed, float init_std,
                                 bool with_grads)
    : LocalParameters(llama_units(config), seed, init_std, with_grads) {}

LocalParameters::LocalParameters(std::vector<UnitSpec> units, uint64_t seed, float init_std,
                                 bool with_grads)
    : specs_(std::move(units)) {
  for (const UnitSpec& unit : specs_) {
    std::vector<Tensor> weights, grads;
    for (const ParamSpec& p : unit.params) {
      Tensor w = Tensor::empty(p.shape);
      init_parameter_rows(w, p.name, 0, seed, init_std);
      weights.push_back(w);
      // A frozen parameter has no gradient (undefined: the model skips its weight gradient).
      if (with_grads) grads.push_back(p.trainable ? Tensor::zeros(p.shape) : Tensor());
    }
    units_.push_back(std::move(weights));
    grads_.push_back(std::move(grads));
  }
}

UnitGrads LocalParameters::grads(int64_t unit, GradSums) {
  FRUGAL_CHECK(!grads_.at(unit).empty(), "gradients asked of inference-only parameters");
  return {grads_[unit]};
}

void LocalParameters::grads_done(int64_t unit) {
  if (last_micro_batch_ && grads_final_) grads_final_(unit);
}

void LocalParameters::zero_grads() {
  for (auto& unit : grads_)
    for (Tensor& g : unit)
      if (g.defined()) g.fill_zero();
}

std::vector<TrainableShard> LocalParameters::trainable() {
  std::vector<TrainableShard> shards;
  for (size_t u = 0; u < specs_.size(); ++u)
    for (size_t i = 0; i < specs_[u].params.size(); ++i)
      if (specs_[u].params[i].trainable)
        shards.push_back({specs_[u].params[i].name, units_[u][i],
                          grads_[u].empty() ? Tensor() : grads_[u][i], Tensor(),
                          whole_rows(specs_[u].params[i].shape, false), int64_t(u)});
  return shards;
}

Tensor& LocalParameters::param(const std::string& name) {
  for (size_t u = 0; u < specs_.size(); ++u)
    for (size_t i = 0; i < specs_[u].params.size(); ++i)
      if (specs_[u].params[i].name == name) return units_[u][i];
  fail("the model has no parameter named '", name, "'");
}

}  // namespace frugal
