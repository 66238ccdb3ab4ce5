// LoRA adapters (Hu et al., 2021), as PEFT defines them: a frozen projection W [out, in] gains
// a trainable low-rank update, y = x W^T + (alpha / r) (x A^T) B^T with A [r, in] and B
// [out, r]; A starts uniform in +-1/sqrt(in) (PEFT's kaiming_uniform with a = sqrt(5)) and B
// at zero, so training starts from the base model exactly.
#pragma once

#include <string>
#include <vector>

#include "model/llama_config.h"

namespace frugal {

struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters (full training)
  double alpha = 16;
  double dropout = 0;        // on each adapter's input while training (PEFT's lora_dropout)
  uint64_t seed = 0;         // mixed into the dropout masks (train.seed)
  std::vector<int> targets;  // BlockParam indices of the adapted projections

  bool enabled() const { return rank > 0; }
  float scale() const { return static_cast<float>(alpha / double(rank)); }
  bool adapts(int block_param) const;
  // Position of the target's A in a block unit (its B follows), or -1.
  int a_index(int block_param) const;
};

// "all" (every linear layer of a block: q, k, v, o, gate, up, down) or a comma-separated
// list of their names ("q_proj,v_proj"); throws Error naming the key for anything else.
std::vector<int> lora_targets_from_names(const std::string& list);
// The same for the config key `key` (fp8.linears takes the same names).
std::vector<int> projections_from_names(const std::string& list, const std::string& key);
std::string lora_target_names(const std::vector<int>& targets);

// The units of `config` with every base parameter frozen and each target projection's
// adapters appended to its block unit, named as PEFT names them without its
// "base_model.model." prefix: "model.layers.3.self_attn.q_proj.lora_A.weight" [r, in] and
// "...lora_B.weight" [out, r].
std::vector<UnitSpec> lora_units(const LlamaConfig& config, const LoraConfig& lora);

// Whether a parameter is one of a block's seven projection matrices (what QLoRA stores in NF4).
// The BlockParam of a block projection's name ("model.layers.3.mlp.up_proj.weight": kUpProj),
// -1 for any other name.
int block_projection_index(const std::string& name);
bool is_block_projection(const std::string& name);

// Whether a parameter name is a LoRA adapter's (for initialisation and export).
bool is_lora_a(const std::string& name);
bool is_lora_b(const std::string& name);

}  // namespace frugal
