// The Llama family's shape, with Hugging Face's key names, and the parameter table derived
// from it: every tensor's HF name and shape, grouped into sharding units (embedding, one per
// transformer block, final norm + head).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/rope_scaling.h"

namespace frugal {

// The family of a model, for what changes the math or the names: Qwen2's q/k/v projections
// have biases. (Mistral is a Llama with a sliding window, LlamaConfig::sliding_window.)
enum class Architecture { llama, qwen2 };
inline std::span<const EnumName<Architecture>> enum_names(Architecture) {
  static constexpr EnumName<Architecture> names[] = {{Architecture::llama, "llama"},
                                                     {Architecture::qwen2, "qwen2"}};
  return names;
}

struct LlamaConfig {
  Architecture architecture = Architecture::llama;
  int64_t hidden_size = 256;
  int64_t intermediate_size = 688;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 4;
  int64_t vocab_size = 2048;
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // none: the plain rotary embedding
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  // Mistral's sliding-window attention: > 0 lets token i attend to tokens j with
  // i - sliding_window < j <= i (itself and the sliding_window - 1 before it, as transformers'
  // MistralForCausalLM); 0: full causal attention.
  int64_t sliding_window = 0;

  bool qkv_bias() const { return architecture == Architecture::qwen2; }
  int64_t attention_head_dim() const {
    return head_dim ? head_dim : hidden_size / num_attention_heads;
  }
  // The longest sequence the model takes: max_position_embeddings, except with dynamic
  // scaling, which exists to run past it (up to factor times it).
  int64_t context_length() const;
  // The rotary table of a forward over sequences of `sequence_length` tokens (rope_scaling.h).
  ops::RotaryFrequencies rotary(int64_t sequence_length) const {
    return rotary_frequencies(rope_scaling, rope_theta, attention_head_dim(),
                              max_position_embeddings, sequence_length);
  }
  // Throws Error naming the key when the shape is impossible (e.g. hidden_size % heads != 0).
  void validate() const;
  int64_t parameter_count() const;
};

// `base` (a model trained for base.max_position_embeddings tokens) with its context extended
// by `scaling` (not none): the original length becomes base's max_position_embeddings unless
// scaling names one, and max_position_embeddings becomes factor times it (dynamic scaling
// keeps it: its context_length() grows instead). Throws Error when base is already scaled.
LlamaConfig with_context_extension(const LlamaConfig& base, const RopeScaling& scaling);

// The shape as JSON with Hugging Face's key names (the subset frugal uses; rope_scaling only
// when there is one); from_json throws Error naming a missing or mistyped key.
nlohmann::json llama_config_to_json(const LlamaConfig& config);
LlamaConfig llama_config_from_json(const nlohmann::json& json, const std::string& source);

// One named parameter of the model.
struct ParamSpec {
  std::string name;  // Hugging Face name, e.g. "model.layers.3.mlp.up_proj.weight"
  Shape shape;
  bool trainable = true;  // false: frozen (the base weights under LoRA): no gradient, no state
};

// A sharding unit: the parameters that are gathered together and released together.
struct UnitSpec {
  std::string name;  // "embed", "layers.3", "head"
  std::vector<ParamSpec> params;
};

// The order of parameters inside a block unit; BlockWeights relies on it.
enum BlockParam : int {
  kInputNorm,
  kQProj,
  kKProj,
  kVProj,
  kOProj,
  kPostAttentionNorm,
  kGateProj,
  kUpProj,
  kDownProj,
  kBlockParamCount
};
// With biases (LlamaConfig::qkv_bias), a block unit holds after those 9 the q, k and v
// projections' biases, in that order.
inline constexpr int kQkvBiasCount = 3;
inline int64_t block_unit_size(const LlamaConfig& c) {
  return kBlockParamCount + (c.qkv_bias() ? kQkvBiasCount : 0);
}

// Units in model order: "embed" (embed_tokens), "layers.0" ... "layers.{L-1}", "head"
// (final norm, and lm_head unless the embeddings are tied: then the head unit reuses the
// embed unit's tensor).
std::vector<UnitSpec> llama_units(const LlamaConfig& config);
// The Hugging Face name prefix of block `layer`'s tensors: "model.layers.3.".
std::string hf_layer_prefix(int64_t layer);
inline int64_t embed_unit() { return 0; }
inline int64_t block_unit(int64_t layer) { return 1 + layer; }
inline int64_t head_unit(const LlamaConfig& c) { return 1 + c.num_hidden_layers; }

}  // namespace frugal
