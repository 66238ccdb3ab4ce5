// Finds the committed step of a run and reads its weights.
#include "train/saved_model.h"

#include <filesystem>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/sharded_reader.h"
#include "model/hf_model.h"
#include "model/lora.h"
#include "quant/hqq.h"
#include "quant/nf4.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

// A LoRA run's checkpoint holds the adapters alone: the base comes back as the run made it
// (its model.hf_path, or the seed's initialisation), and each adapted projection gets its
// update merged in, W += (alpha / r) B A, so the result is an ordinary model.
std::unique_ptr<LocalParameters> load_lora_merged(const nlohmann::json& config,
                                                  const LlamaConfig& shape,
                                                  ShardedTensorReader& reader,
                                                  const std::string& source) {
  auto key = [&](const std::string& name) {
    if (!config.contains(name))
      fail("checkpoint '", source, "' of a LoRA run has no '", name, "' in its configuration");
    return config.at(name).get<std::string>();
  };
  LoraConfig lora;
  lora.rank = std::stoll(key("lora.rank"));
  lora.alpha = std::stod(key("lora.alpha"));
  lora.targets = lora_targets_from_names(key("lora.targets"));
  std::unique_ptr<LocalParameters> params;
  const std::string hf_path = config.value("model.hf_path", std::string());
  if (!hf_path.empty()) {
    if (!fs::exists(hf_path))
      fail("checkpoint '", source, "' holds LoRA adapters on the base model '", hf_path,
           "', which is gone: it is needed to rebuild the model");
    params = HfModelDir(hf_path).load();
  } else {
    params = std::make_unique<LocalParameters>(shape, std::stoull(key("train.seed")),
                                               std::stof(key("train.init_std")), false);
  }
  const std::string type = key("train.type");
  if (type == "qlora" || type == "hqq_lora") {
    // The run trained on a 4-bit base: what it saw is the dequantized weight (the whole
    // tensor's quantization is what the ranks' shards make together).
    for (const UnitSpec& unit : llama_units(shape))
      for (const ParamSpec& spec : unit.params)
        if (spec.shape.size() == 2 && is_block_projection(spec.name)) {
          Tensor& w = params->param(spec.name);
          w.copy_from(type == "qlora" ? nf4_dequantize(nf4_quantize(w, spec.name))
                                      : hqq_dequantize(hqq_quantize(w, spec.name)));
        }
  }
  for (const UnitSpec& unit : lora_units(shape, lora))
    for (const ParamSpec& spec : unit.params) {
      if (!is_lora_a(spec.name)) continue;
      const std::string stem = spec.name.substr(0, spec.name.size() - std::string(".lora_A.weight").size());
      Tensor& w = params->param(stem + ".weight");
      const int64_t out = w.size(0), in = w.size(1), r = lora.rank;
      const Tensor a = reader.read_full("model/" + spec.name, {r, in});
      const Tensor b = reader.read_full("model/" + stem + ".lora_B.weight", {out, r});
      // W[o, i] += s * sum_j B[o, j] A[j, i], in double.
      const float* pa = a.data<float>();
      const float* pb = b.data<float>();
      float* pw = w.data<float>();
      const double s = lora.alpha / double(r);
#pragma omp parallel for schedule(static)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          double sum = 0;
          for (int64_t j = 0; j < r; ++j) sum += double(pb[o * r + j]) * pa[j * in + i];
          pw[o * in + i] = static_cast<float>(pw[o * in + i] + s * sum);
        }
    }
  return params;
}

}  // namespace

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
  saved.step = *step;
  saved.step_dir = dir.step_dir(*step);
  ShardedTensorReader reader(dir, *step, manifest.at("world_size").get<int>());
  const nlohmann::json config = manifest.value("config", nlohmann::json::object());
  const std::string type = config.value("train.type", std::string("full"));
  if (type == "lora" || type == "qlora" || type == "hqq_lora") {
    saved.params = load_lora_merged(config, saved.config, reader, dir.rank_file(*step, 0));
  } else {
    saved.params = std::make_unique<LocalParameters>(saved.config, 0, 0.0f, false);
    // Tensor by tensor, so host memory stays near the model plus one tensor.
    for (const UnitSpec& unit : saved.params->specs())
      for (const ParamSpec& spec : unit.params)
        saved.params->param(spec.name).copy_from(
            reader.read_full("model/" + spec.name, spec.shape));
  }
  if (fs::exists(run_dir / "tokenizer.model"))
    saved.tokenizer_path = (run_dir / "tokenizer.model").string();
  return saved;
}

}  // namespace frugal
