// The run's own checkpoint state, beside the model's, optimizer's and sampler's: the model's
// shape (a checkpoint of another shape is refused by name) and every key in force (saved for
// the record; a resume with other settings is said, key by key).
#pragma once

#include <map>
#include <string>

#include "core/stateful.h"
#include "model/llama_config.h"

namespace frugal {

class ModelShapeState : public Stateful {
 public:
  explicit ModelShapeState(const LlamaConfig& config) : config_(config) {}
  nlohmann::json state_values() const override;
  // An Error when the checkpoint's model is not this one.
  void load_state_values(const nlohmann::json& values) override;

 private:
  const LlamaConfig& config_;
};

// `frugal ckpt ls` and export show the saved keys. Resuming with other settings is allowed
// (more steps, another eval interval) but warned about: another seed or learning rate is
// rarely meant.
class ResolvedConfigState : public Stateful {
 public:
  explicit ResolvedConfigState(const std::map<std::string, std::string>& resolved)
      : resolved_(resolved) {}
  nlohmann::json state_values() const override;
  void load_state_values(const nlohmann::json& values) override;

 private:
  const std::map<std::string, std::string>& resolved_;
};

}  // namespace frugal
