// Finds the committed step of a run and reads its weights.
#include "train/saved_model.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/safetensors.h"
#include "ckpt/sharded_reader.h"
#include "config/train_config.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "model/hf_model.h"
#include "model/lora.h"
#include "ops/ops.h"
#include "quant/hqq.h"
#include "quant/nf4.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

// A key of a run's resolved configuration (a checkpoint manifest's "config").
std::string run_key(const nlohmann::json& config, const std::string& name,
                    const std::string& source) {
  if (!config.contains(name))
    fail("checkpoint '", source, "' of a LoRA run has no '", name, "' in its configuration");
  return config.at(name).get<std::string>();
}

// A run's train.type (runs from before LoRA have none: full).
TrainType train_type_of_run(const nlohmann::json& config, const std::string& source) {
  const std::string name = config.value("train.type", std::string("full"));
  if (const std::optional<TrainType> type = enum_from_name<TrainType>(name)) return *type;
  fail("checkpoint '", source, "': train.type '", name, "' is not one of ",
       enum_name_list<TrainType>());
}

// The adapters a LoRA run trained, as its configuration describes them.
LoraConfig lora_of_run(const nlohmann::json& config, const std::string& source) {
  LoraConfig lora;
  lora.rank = std::stoll(run_key(config, "lora.rank", source));
  lora.alpha = std::stod(run_key(config, "lora.alpha", source));
  lora.targets = lora_targets_from_names(run_key(config, "lora.targets", source));
  return lora;
}

// A LoRA run's checkpoint holds the adapters alone: the base comes back as the run made it
// (its model.hf_path, or the seed's initialisation), and each adapted projection gets its
// update merged in, W += (alpha / r) B A, so the result is an ordinary model.
std::unique_ptr<LocalParameters> load_lora_merged(const nlohmann::json& config,
                                                  const LlamaConfig& shape,
                                                  ShardedTensorReader& reader,
                                                  const std::string& source) {
  auto key = [&](const std::string& name) { return run_key(config, name, source); };
  const LoraConfig lora = lora_of_run(config, source);
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
  const TrainType type = train_type_of_run(config, source);
  if (type == TrainType::qlora || type == TrainType::hqq_lora) {
    // The run trained on a 4-bit base: what it saw is the dequantized weight (the whole
    // tensor's quantization is what the ranks' shards make together).
    for (const UnitSpec& unit : llama_units(shape))
      for (const ParamSpec& spec : unit.params)
        if (spec.shape.size() == 2 && is_block_projection(spec.name)) {
          Tensor& w = params->param(spec.name);
          w.copy_from(type == TrainType::qlora ? nf4_dequantize(nf4_quantize(w, spec.name))
                                               : hqq_dequantize(hqq_quantize(w, spec.name)));
        }
  }
  for (const UnitSpec& unit : lora_units(shape, lora))
    for (const ParamSpec& spec : unit.params) {
      if (!is_lora_a(spec.name)) continue;
      const std::string stem =
          spec.name.substr(0, spec.name.size() - std::string(".lora_A.weight").size());
      Tensor& w = params->param(stem + ".weight");
      const int64_t out = w.size(0), in = w.size(1), r = lora.rank;
      const Tensor a = reader.read_full("model/" + spec.name, {r, in});
      const Tensor b = reader.read_full("model/" + stem + ".lora_B.weight", {out, r});
      // W += (alpha / r) B A, as one GEMM: B [out, r] times A^T [in, r] transposed.
      Tensor a_t = Tensor::empty({in, r});
      for (int64_t j = 0; j < r; ++j)
        for (int64_t i = 0; i < in; ++i) a_t.data<float>()[i * r + j] = a.data<float>()[j * in + i];
      Tensor update = ops::linear(b, a_t);
      ops::scale_inplace(update, lora.scale());
      ops::add_inplace(w, update);
    }
  return params;
}

// The committed step a path names (a run directory, its ckpt/, or a step directory).
struct SavedStep {
  std::unique_ptr<CheckpointDir> dir;
  int64_t step = 0;
  fs::path run_dir;
  nlohmann::json manifest;
};

SavedStep open_saved_step(const std::string& path) {
  const fs::path p(path);
  if (!fs::exists(p)) fail("checkpoint '", path, "' does not exist");
  fs::path ckpt_root;
  std::optional<int64_t> step;
  if (p.filename().string().rfind("step_", 0) == 0 ||
      p.parent_path().filename().string().rfind("step_", 0) == 0) {
    fs::path step_dir = p.filename().string().rfind("step_", 0) == 0 ? p : p.parent_path();
    ckpt_root = step_dir.parent_path();
    step = std::stoll(step_dir.filename().string().substr(5));
  } else if (CheckpointDir::holds_checkpoints(p.string())) {
    ckpt_root = p;
  } else if (CheckpointDir::holds_checkpoints((p / "ckpt").string())) {
    ckpt_root = p / "ckpt";
  } else {
    fail("'", path,
         "' is neither a frugal run directory, its ckpt/ directory, nor a step directory "
         "(no LATEST or step directory found)");
  }
  SavedStep s;
  s.run_dir = ckpt_root.parent_path();
  s.dir = std::make_unique<CheckpointDir>(ckpt_root.string());
  if (!step) step = s.dir->latest();
  if (!step) fail("no committed checkpoint under '", ckpt_root.string(), "'");
  s.step = *step;
  s.manifest = s.dir->manifest(*step);
  if (!s.manifest.contains("model") || !s.manifest.contains("world_size"))
    fail("checkpoint '", s.dir->rank_file(*step, 0), "' has no model description in its manifest");
  return s;
}

}  // namespace

SavedModel load_saved_model(const std::string& path) {
  SavedStep opened = open_saved_step(path);
  CheckpointDir& dir = *opened.dir;
  const std::optional<int64_t> step = opened.step;
  const fs::path run_dir = opened.run_dir;
  const nlohmann::json& manifest = opened.manifest;
  SavedModel saved;
  saved.config = llama_config_from_json(manifest.at("model"), dir.rank_file(*step, 0));
  saved.step = *step;
  saved.step_dir = dir.step_dir(*step);
  ShardedTensorReader reader(dir, *step, manifest.at("world_size").get<int>(), manifest);
  const nlohmann::json config = manifest.value("config", nlohmann::json::object());
  if (train_type_of_run(config, dir.rank_file(*step, 0)) != TrainType::full) {
    saved.params = load_lora_merged(config, saved.config, reader, dir.rank_file(*step, 0));
  } else {
    saved.params = std::make_unique<LocalParameters>(saved.config, 0, 0.0f, false);
    // Tensor by tensor, so host memory stays near the model plus one tensor.
    for (const UnitSpec& unit : saved.params->specs())
      for (const ParamSpec& spec : unit.params)
        saved.params->param(spec.name).copy_from(
            reader.read_full("model/" + spec.name, spec.shape));
  }
  saved.tokenizer_path = find_tokenizer(run_dir.string());
  return saved;
}

SavedModelRows::SavedModelRows(const std::string& path) {
  SavedStep opened = open_saved_step(path);
  const std::string source = opened.dir->rank_file(opened.step, 0);
  config_ = llama_config_from_json(opened.manifest.at("model"), source);
  step_dir_ = opened.dir->step_dir(opened.step);
  tokenizer_path_ = find_tokenizer(opened.run_dir.string());
  const nlohmann::json config = opened.manifest.value("config", nlohmann::json::object());
  if (train_type_of_run(config, source) != TrainType::full) {
    merged_ = load_saved_model(path).params;
    return;
  }
  // The reader refers to the directory: both live as long as this object.
  dir_ = std::move(opened.dir);
  reader_ = std::make_unique<ShardedTensorReader>(
      *dir_, opened.step, opened.manifest.at("world_size").get<int>(), opened.manifest);
}

SavedModelRows::~SavedModelRows() = default;

void SavedModelRows::read_rows_into(const std::string& name, int64_t first, int64_t last,
                                    Tensor& rows) {
  if (merged_) {
    rows.copy_from(merged_->param(name).rows(first, last));
    return;
  }
  Shape shape;
  for (const UnitSpec& unit : llama_units(config_))
    for (const ParamSpec& p : unit.params)
      if (p.name == name) shape = p.shape;
  FRUGAL_CHECK(!shape.empty(), "checkpoint '", step_dir_, "' has no parameter '", name, "'");
  rows.copy_from(reader_->read_rows("model/" + name, shape, first, last));
}

void export_peft_adapters(const std::string& path, const std::string& out_dir) {
  SavedStep opened = open_saved_step(path);
  const nlohmann::json config = opened.manifest.value("config", nlohmann::json::object());
  const std::string source = opened.dir->rank_file(opened.step, 0);
  const TrainType type = train_type_of_run(config, source);
  if (type == TrainType::full)
    fail("checkpoint '", source,
         "' is of a full training run: it has no adapters to export as "
         "PEFT (export it without --peft)");
  const LlamaConfig shape = llama_config_from_json(opened.manifest.at("model"), source);
  const LoraConfig lora = lora_of_run(config, source);
  ShardedTensorReader reader(*opened.dir, opened.step, opened.manifest.at("world_size").get<int>(),
                             opened.manifest);
  // PEFT's names: the model wrapped as base_model.model.
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const UnitSpec& unit : lora_units(shape, lora))
    for (const ParamSpec& spec : unit.params)
      if (spec.trainable)
        tensors.emplace_back("base_model.model." + spec.name,
                             reader.read_full("model/" + spec.name, spec.shape));
  fs::create_directories(out_dir);
  write_safetensors((fs::path(out_dir) / "adapter_model.safetensors").string(), tensors, DType::f32,
                    {{"format", "pt"}});
  nlohmann::json targets = nlohmann::json::array();
  std::stringstream names(lora_target_names(lora.targets));
  for (std::string name; std::getline(names, name, ',');) targets.push_back(name);
  const nlohmann::json adapter = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", lora.rank},
      {"lora_alpha", lora.alpha},
      {"lora_dropout", std::stod(config.value("lora.dropout", std::string("0")))},
      {"target_modules", targets},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"use_rslora", false},
      {"use_dora", false},
      {"modules_to_save", nullptr},
      {"base_model_name_or_path", config.value("model.hf_path", std::string())}};
  std::ofstream((fs::path(out_dir) / "adapter_config.json").string()) << adapter.dump(2) << "\n";
  if (type != TrainType::lora)
    log_warn("export: the adapters of this ", type, " run were trained on a 4-bit base; applied ",
             "to the full-precision base they give a slightly different model (the merged export "
             "is exact)");
}

}  // namespace frugal
