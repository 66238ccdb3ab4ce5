// The simplest ParameterProvider: every weight whole on this rank, with a gradient of the same
// size. One-rank training and inference use it; ZeRO-3 (parallel/) shards the same units.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/parameter_provider.h"

namespace frugal {

class LocalParameters : public ParameterProvider {
 public:
  // Initialised from `seed` (see init_parameter_rows); with_grads = false for inference.
  LocalParameters(const LlamaConfig& config, uint64_t seed, float init_std, bool with_grads);
  // Any units (e.g. lora_units): frozen parameters get no gradient and are not trainable().
  LocalParameters(std::vector<UnitSpec> units, uint64_t seed, float init_std, bool with_grads);

  std::vector<Tensor> gather(int64_t unit) override { return units_.at(unit); }
  void release(int64_t) override {}
  UnitGrads grads(int64_t unit, GradSums sums) override;
  // Per-layer updates: the unit's gradients are final at its grads_done of the last micro-batch.
  void grads_done(int64_t unit) override;
  void zero_grads() override;
  void begin_micro_batch(bool last) override { last_micro_batch_ = last; }
  void set_grads_final(std::function<void(int64_t)> on_final) override {
    grads_final_ = std::move(on_final);
  }
  std::vector<TrainableShard> trainable() override;

  // Every parameter by its Hugging Face name, for checkpoints and export.
  const std::vector<UnitSpec>& specs() const { return specs_; }
  Tensor& param(const std::string& name);

 private:
  std::vector<UnitSpec> specs_;
  std::vector<std::vector<Tensor>> units_;
  std::vector<std::vector<Tensor>> grads_;
  bool last_micro_batch_ = true;
  std::function<void(int64_t)> grads_final_;
};

}  // namespace frugal
