// Hugging Face model directories of the Llama family: reading config.json and the weights
// (model.safetensors or shards with model.safetensors.index.json) tensor by tensor or row
// range by row range, and exporting a frugal model as a directory transformers and vLLM load.
//
// Accepted: LlamaForCausalLM (model_type "llama"), MistralForCausalLM ("mistral", with its
// sliding_window) and Qwen2ForCausalLM ("qwen2": q/k/v biases; its sliding window off), with
// GQA, rope_theta and rope scaling of types default, linear, dynamic, yarn and llama3
// (rope_scaling, or transformers 5's "rope_parameters"), rms_norm_eps, tie_word_embeddings and
// head_dim. Refused with a message naming the key: other architectures, other rope types
// (longrope, ...), attention or MLP biases, an activation other than silu, Qwen2's
// use_sliding_window. A model with a sliding window is exported as a MistralForCausalLM.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/llama_config.h"
#include "model/local_parameters.h"
#include "model/parameter_provider.h"

namespace frugal {

class SafetensorsSet;

// The LlamaConfig of a Hugging Face config.json; `source` names the file in messages.
LlamaConfig llama_config_from_hf_json(const nlohmann::json& json, const std::string& source);

// config.json for an exported model: LlamaForCausalLM, model_type llama, silu, no biases, no
// rope scaling; `torch_dtype` is "float32" or "bfloat16".
nlohmann::json hf_config_json(const LlamaConfig& config, DType dtype, int32_t bos_token_id = 1,
                              int32_t eos_token_id = 2);

class HfModelDir {
 public:
  // Reads DIR/config.json and opens the weights (all shards: a missing one fails here). No
  // tensor is read yet.
  explicit HfModelDir(const std::string& dir);
  ~HfModelDir();
  HfModelDir(HfModelDir&&) noexcept;
  HfModelDir& operator=(HfModelDir&&) noexcept;

  const std::string& dir() const { return dir_; }
  const LlamaConfig& config() const { return config_; }
  // From config.json; -1 when absent (a list of eos ids gives its first).
  int32_t bos_token_id() const { return bos_token_id_; }
  int32_t eos_token_id() const { return eos_token_id_; }
  // DIR/tokenizer.model, else DIR/tokenizer.json, or empty when the directory has neither.
  std::string tokenizer_path() const;

  // Every parameter frugal's model needs, by unit, with the shapes config.json implies. A
  // tied model has no lm_head.weight (the head reuses model.embed_tokens.weight).
  const std::vector<UnitSpec>& specs() const { return specs_; }
  // The shape `hf_name` must have; throws Error when the model has no such parameter.
  const Shape& expected_shape(const std::string& hf_name) const;

  // Rows [row_begin, row_end) of one parameter as f32 [row_end - row_begin, ...], converted
  // from whatever float type the file stores. Reads only those rows of the memory-mapped
  // file, so a ZeRO-3 rank that loads its shard holds in memory its shard and nothing else.
  // Throws Error naming the file and tensor when the tensor is missing or its shape is not
  // the one config.json implies, and naming the row and column of a NaN or infinity.
  Tensor read_rows(const std::string& hf_name, int64_t row_begin, int64_t row_end,
                   Arena& arena = host_arena()) const;
  // The same into an existing f32 host tensor (e.g. a shard buffer) of that many elements.
  void read_rows_into(const std::string& hf_name, int64_t row_begin, int64_t row_end,
                      const Tensor& out) const;
  // The whole parameter.
  Tensor read(const std::string& hf_name, Arena& arena = host_arena()) const;

  // Checks that every parameter exists with its expected shape (without reading data), and
  // that the files hold nothing the model does not use (a tied model's lm_head.weight only
  // when it equals the embedding: then a warning).
  void validate_tensors() const;
  // Copies every parameter into `params` (built from config()), one tensor at a time
  // straight into its destination: no second copy of the model is made.
  void load_into(LocalParameters& params) const;
  // A LocalParameters (no gradients) holding this model's weights.
  std::unique_ptr<LocalParameters> load() const;

 private:
  void check_tied_head() const;

  std::string dir_;
  LlamaConfig config_;
  int32_t bos_token_id_ = -1;
  int32_t eos_token_id_ = -1;
  std::vector<UnitSpec> specs_;
  std::unique_ptr<SafetensorsSet> weights_;
};

struct HfExportOptions {
  DType dtype = DType::f32;    // f32 or bf16 on disk
  std::string tokenizer_path;  // copied as tokenizer.model or tokenizer.json when not empty
  int32_t bos_token_id = 1;
  int32_t eos_token_id = 2;
  // Under ZeRO-3 every rank must take part in the gathers, but one writes: the others pass
  // false and write nothing.
  bool write_files = true;
};

// Writes DIR/config.json, DIR/model.safetensors (every parameter under its Hugging Face name;
// a tied model writes only the embedding) and, given a tokenizer, DIR/tokenizer.model with a
// tokenizer_config.json for LlamaTokenizer, or DIR/tokenizer.json with the
// tokenizer_config.json that was beside it. Weights are gathered from `params` one unit at a
// time and written as they arrive. Creates DIR; overwrites these files in it.
void export_hf(const std::string& dir, const LlamaConfig& config, ParameterProvider& params,
               const HfExportOptions& options);

}  // namespace frugal
