// Rotary scaling for long context, as transformers computes it (modeling_rope_utils.py): the
// plain rotary embedding, position interpolation (linear), dynamic NTK, YaRN and Llama 3's
// scaling. Each is a table of inverse frequencies plus a factor on cos/sin (YaRN's
// attention factor); the kernels rotate by whatever table they are given.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>

#include "core/enum_names.h"
#include "ops/ops.h"

namespace frugal {

// Hugging Face's rope_type; none is "default" (no scaling).
enum class RopeScalingType { none, linear, dynamic, yarn, llama3 };

inline std::span<const EnumName<RopeScalingType>> enum_names(RopeScalingType) {
  static constexpr EnumName<RopeScalingType> names[] = {{RopeScalingType::none, "none"},
                                                        {RopeScalingType::linear, "linear"},
                                                        {RopeScalingType::dynamic, "dynamic"},
                                                        {RopeScalingType::yarn, "yarn"},
                                                        {RopeScalingType::llama3, "llama3"}};
  return names;
}

// config.json's rope_scaling with transformers' defaults filled in. Which fields a type reads:
//   linear   factor: every frequency divided by it (position interpolation)
//   dynamic  factor: the base grows with the sequence once it passes max_position_embeddings
//   yarn     factor, original_max_position_embeddings, beta_fast, beta_slow, truncate, and
//            attention_factor (or mscale, mscale_all_dim, from which it is derived)
//   llama3   factor, original_max_position_embeddings, low_freq_factor, high_freq_factor
struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0: max_position_embeddings
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 0.0;  // yarn; 0: from factor (and mscale)
  double mscale = 0.0;            // yarn; 0: unused
  double mscale_all_dim = 0.0;    // yarn; 0: unused

  bool operator==(const RopeScaling&) const = default;
};

// Throws Error starting with `where` (a file, or the config keys) for impossible values.
void validate_rope_scaling(const RopeScaling& scaling, const std::string& where);

// The rope_scaling object of a Hugging Face config.json (null or absent: none; "type" or
// "rope_type", "default" meaning none). `source` names the file in messages.
// YaRN without a factor takes max_position_embeddings / original_max_position_embeddings.
RopeScaling rope_scaling_from_hf_json(const nlohmann::json& json, int64_t max_position_embeddings,
                                      const std::string& source);
// config.json's rope_scaling for `scaling`: null for none, else the keys transformers reads.
nlohmann::json rope_scaling_to_hf_json(const RopeScaling& scaling, int64_t max_position_embeddings);

// The inverse frequencies and cos/sin factor of a model with this head dimension and base,
// for a forward over sequences of `sequence_length` tokens (only dynamic scaling reads it:
// its base is set by the longest position in the forward, as transformers' dynamic update
// does on a fresh model).
ops::RotaryFrequencies rotary_frequencies(const RopeScaling& scaling, double theta,
                                          int64_t head_dim, int64_t max_position_embeddings,
                                          int64_t sequence_length);

}  // namespace frugal
