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
  // 8-bit moments are saved as codes and block scales, the others as fp32 values (which fp32
  // and bf16 moments both read): a checkpoint of one kind cannot be resumed as the other.
  const auto state_dtype = [](const std::map<std::string, std::string>& keys) {
    const auto it = keys.find("optim.state_dtype");
    return it == keys.end() ? std::string("fp32") : it->second;
  };
  if ((state_dtype(now) == "int8") != (state_dtype(saved) == "int8"))
    fail("it holds ", state_dtype(saved) == "int8" ? "8-bit" : "fp32",
         " optimizer moments (optim.state_dtype = ", state_dtype(saved),
         ") and this run asks for optim.state_dtype = ", state_dtype(now),
         ": resume with the checkpoint's, or start a new train.out_dir");
  const std::string differences = config_differences(now, saved, "checkpoint");
  if (!differences.empty())
    log_warn("resuming with settings that differ from the checkpoint's:", differences);
}

}  // namespace frugal
