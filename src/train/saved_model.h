// Loading a trained model back from frugal's own checkpoints, for eval, generate and export.
#pragma once

#include <memory>
#include <string>

#include "model/llama_config.h"
#include "model/local_parameters.h"

namespace frugal {

struct SavedModel {
  LlamaConfig config;
  std::unique_ptr<LocalParameters> params;  // whole weights, no gradients
  int64_t step = 0;
  std::string step_dir;        // the checkpoint step directory that was read
  std::string tokenizer_path;  // the run's tokenizer.model or .json, empty when there is none
};

// `path` may be a run directory (out_dir of `frugal train`), its ckpt/ directory, or one
// step directory (ckpt/step_00000400). Checksums are verified; errors name the file.
SavedModel load_saved_model(const std::string& path);

// A LoRA run's adapters as a PEFT adapter directory: adapter_model.safetensors (PEFT's names,
// base_model.model.<name>, f32) and adapter_config.json (r, lora_alpha, target_modules, and
// the run's model.hf_path as base_model_name_or_path). `path` as for load_saved_model.
void export_peft_adapters(const std::string& path, const std::string& out_dir);

}  // namespace frugal
