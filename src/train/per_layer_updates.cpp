// Per-layer updates: each unit's norm, clipping factor, collectives and update as its
// gradients become final.
#include "train/per_layer_updates.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "ops/ops.h"

namespace frugal {

void PerLayerUpdates::begin_step(
    ParameterProvider& params, Optimizer& optimizer, double lr, int64_t step,
    const StepCollectives& collectives, std::vector<int64_t> final_at_end,
    std::function<void(const std::vector<size_t>&)> before_unit_update) {
  params_ = &params;
  optimizer_ = &optimizer;
  collectives_ = collectives;
  before_unit_update_ = std::move(before_unit_update);
  final_at_end_ = std::move(final_at_end);
  slices_of_.clear();
  grads_of_.clear();
  const std::vector<TrainableShard> shards = params.trainable();
  FRUGAL_CHECK(shards.size() == optimizer.slices(), "the provider has ", shards.size(),
               " trainable slices, the optimizer ", optimizer.slices());
  for (size_t k = 0; k < shards.size(); ++k) {
    const int64_t unit = shards[k].unit;
    FRUGAL_CHECK(unit >= 0, "trainable slice '", shards[k].name, "' names no unit");
    if (size_t(unit) >= slices_of_.size()) {
      slices_of_.resize(size_t(unit) + 1);
      grads_of_.resize(size_t(unit) + 1);
    }
    slices_of_[size_t(unit)].push_back(k);
    grads_of_[size_t(unit)].push_back(shards[k].grad);
  }
  done_.assign(slices_of_.size(), false);
  report_ = PerLayerReport();
  for (const auto& slices : slices_of_)
    if (!slices.empty()) ++report_.units;
  sum_squares_ = 0;
  stopped_ = false;
  optimizer.begin_per_layer_step(lr, step);
  params.set_grads_final([this](int64_t unit) {
    // A tied unit's first gradients (the head's) are not its last.
    if (std::find(final_at_end_.begin(), final_at_end_.end(), unit) == final_at_end_.end())
      unit_final(unit);
  });
}

double PerLayerUpdates::clip_scale(double unit_norm) const {
  if (grad_clip_ <= 0) return 1;
  switch (clip_) {
    case PerLayerClip::none:
      return 1;
    case PerLayerClip::unit: {
      // grad_clip / sqrt(U) per unit: the clipped units' squares sum to at most grad_clip^2.
      const double limit = grad_clip_ / std::sqrt(double(std::max<int64_t>(1, report_.units)));
      return unit_norm > limit ? limit / (unit_norm + 1e-6) : 1;
    }
    case PerLayerClip::previous_norm:
      // The factor global clipping takes (AdamW::begin_step), from the previous step's norm.
      return previous_norm_ > grad_clip_ ? grad_clip_ / (previous_norm_ + 1e-6) : 1;
  }
  return 1;
}

void PerLayerUpdates::unit_final(int64_t unit) {
  if (unit < 0 || size_t(unit) >= slices_of_.size() || slices_of_[size_t(unit)].empty())
    return;  // frozen (LoRA's embedding and head)
  FRUGAL_CHECK(!done_[size_t(unit)], "per-layer updates: unit ", unit,
               "'s gradients were final twice in one step");
  done_[size_t(unit)] = true;
  if (stopped_) return;  // a unit before it was not finite
  const std::vector<size_t>& slices = slices_of_[size_t(unit)];
  if (before_unit_update_) before_unit_update_(slices);
  // The unit's squared norm over the ranks (a collective: every rank names the units in the
  // same order, the backward's).
  const double unit_squares = collectives_.sum(ops::sum_squares(grads_of_[size_t(unit)]));
  sum_squares_ += unit_squares;
  if (!std::isfinite(unit_squares)) {
    // Every rank sees the same sum: all stop here, and the units after this one keep their
    // weights and state (see the header).
    stopped_ = true;
    report_.first_nonfinite_unit = unit;
    return;
  }
  optimizer_->begin_slices(slices, clip_scale(std::sqrt(unit_squares)), collectives_);
  for (size_t k : slices) optimizer_->update(k);
  ++report_.units_updated;
}

PerLayerReport PerLayerUpdates::finish_step() {
  FRUGAL_CHECK(params_, "PerLayerUpdates::finish_step without begin_step");
  params_->set_grads_final({});
  for (int64_t unit : final_at_end_) unit_final(unit);
  for (size_t u = 0; u < slices_of_.size(); ++u)
    FRUGAL_CHECK(slices_of_[u].empty() || done_[u], "per-layer updates: unit ", u,
                 " has trainable slices but its gradients were never final in the step");
  params_->weights_updated();
  params_ = nullptr;
  report_.grad_norm = std::sqrt(sum_squares_);
  if (stopped_) report_.grad_norm = std::numeric_limits<double>::quiet_NaN();
  // previous_norm keeps the last finite norm: a skipped (non-finite) step does not reset it.
  if (std::isfinite(report_.grad_norm)) previous_norm_ = report_.grad_norm;
  return report_;
}

void PerLayerUpdates::abandon_step() {
  if (params_) params_->set_grads_final({});
  params_ = nullptr;
}

nlohmann::json PerLayerUpdates::state_values() const {
  return {{"previous_grad_norm", previous_norm_}};
}

void PerLayerUpdates::load_state_values(const nlohmann::json& values) {
  previous_norm_ = values.at("previous_grad_norm").get<double>();
}

}  // namespace frugal
