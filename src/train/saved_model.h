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

// A checkpoint's model read row range by row range, so that a rank of a sharded eval holds its
// own rows only: a full run's weights straight from the rank files; a LoRA run's merged model
// (built whole once, as load_saved_model builds it). `path` as for load_saved_model.
class CheckpointDir;
class ShardedTensorReader;
class SavedModelRows {
 public:
  explicit SavedModelRows(const std::string& path);
  ~SavedModelRows();
  const LlamaConfig& config() const { return config_; }
  const std::string& step_dir() const { return step_dir_; }
  const std::string& tokenizer_path() const { return tokenizer_path_; }
  // Rows [first, last) of parameter `name` (its Hugging Face name) into `rows` (f32, host).
  void read_rows_into(const std::string& name, int64_t first, int64_t last, Tensor& rows);

 private:
  LlamaConfig config_;
  std::string step_dir_, tokenizer_path_;
  std::unique_ptr<CheckpointDir> dir_;           // a full run: its files
  std::unique_ptr<ShardedTensorReader> reader_;  // and the rows in them
  std::unique_ptr<LocalParameters> merged_;      // a LoRA run
};

// A LoRA run's adapters as a PEFT adapter directory: adapter_model.safetensors (PEFT's names,
// base_model.model.<name>, f32) and adapter_config.json (r, lora_alpha, target_modules, and
// the run's model.hf_path as base_model_name_or_path). `path` as for load_saved_model.
void export_peft_adapters(const std::string& path, const std::string& out_dir);

}  // namespace frugal
