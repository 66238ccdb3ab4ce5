// Finds the committed step of a run and reads its weights.
#include "train/saved_model.h"

#include <filesystem>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/sharded_reader.h"

namespace fs = std::filesystem;

namespace frugal {

SavedModel load_saved_model(const std::string& path) {
  const fs::path p(path);
  if (!fs::exists(p)) fail("checkpoint '", path, "' does not exist");
  fs::path ckpt_root, run_dir;
  std::optional<int64_t> step;
  if (p.filename().string().rfind("step_", 0) == 0 ||
      p.parent_path().filename().string().rfind("step_", 0) == 0) {
    fs::path step_dir = p.filename().string().rfind("step_", 0) == 0 ? p : p.parent_path();
    ckpt_root = step_dir.parent_path();
    step = std::stoll(step_dir.filename().string().substr(5));
  } else if (fs::exists(p / "LATEST")) {
    ckpt_root = p;
  } else if (fs::exists(p / "ckpt" / "LATEST")) {
    ckpt_root = p / "ckpt";
  } else {
    fail("'", path,
         "' is neither a frugal run directory, its ckpt/ directory, nor a step directory "
         "(no LATEST found)");
  }
  run_dir = ckpt_root.parent_path();
  CheckpointDir dir(ckpt_root.string());
  if (!step) step = dir.latest();
  if (!step) fail("no committed checkpoint under '", ckpt_root.string(), "'");

  const nlohmann::json manifest = dir.manifest(*step);
  if (!manifest.contains("model") || !manifest.contains("world_size"))
    fail("checkpoint '", dir.rank_file(*step, 0), "' has no model description in its manifest");
  SavedModel saved;
  saved.config = llama_config_from_json(manifest.at("model"), dir.rank_file(*step, 0));
  saved.params = std::make_unique<LocalParameters>(saved.config, 0, 0.0f, false);
  saved.step = *step;
  saved.step_dir = dir.step_dir(*step);
  // Tensor by tensor, so host memory stays near the model plus one tensor.
  ShardedTensorReader reader(dir, *step, manifest.at("world_size").get<int>());
  for (const UnitSpec& unit : saved.params->specs())
    for (const ParamSpec& spec : unit.params)
      saved.params->param(spec.name).copy_from(reader.read_full("model/" + spec.name, spec.shape));
  if (fs::exists(run_dir / "tokenizer.model"))
    saved.tokenizer_path = (run_dir / "tokenizer.model").string();
  return saved;
}

}  // namespace frugal
