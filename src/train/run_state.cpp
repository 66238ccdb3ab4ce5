// The run's own checkpoint state: the model's shape and the keys in force.
#include "train/run_state.h"

#include "core/error.h"
#include "core/log.h"
#include "train/same_config.h"

namespace frugal {

nlohmann::json ModelShapeState::state_values() const { return llama_config_to_json(config_); }

void ModelShapeState::load_state_values(const nlohmann::json& values) {
  if (values != llama_config_to_json(config_))
    fail("it has model ", values.dump(), " but the config asks for ",
         llama_config_to_json(config_).dump());
}

nlohmann::json ResolvedConfigState::state_values() const { return resolved_; }

void ResolvedConfigState::load_state_values(const nlohmann::json& values) {
  std::map<std::string, std::string> now = resolved_;
  auto saved = values.get<std::map<std::string, std::string>>();
  now.erase("train.resume");  // what a resumed run always changes
  saved.erase("train.resume");
  const std::string differences = config_differences(now, saved, "checkpoint");
  if (!differences.empty())
    log_warn("resuming with settings that differ from the checkpoint's:", differences);
}

}  // namespace frugal
