// Llama shape validation and the parameter table.
#include "model/llama_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>

#include "core/checked.h"

namespace frugal {

void LlamaConfig::validate() const {
  auto positive = [](const char* key, int64_t v) {
    if (v <= 0) fail("config key 'model.", key, "': value ", v, " must be positive");
  };
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  if (head_dim < 0) fail("config key 'model.head_dim': value ", head_dim, " must be >= 0");
  if (head_dim == 0 && hidden_size % num_attention_heads != 0)
    fail("config key 'model.hidden_size': ", hidden_size,
         " is not divisible by model.num_attention_heads = ", num_attention_heads);
  if (num_attention_heads % num_key_value_heads != 0)
    fail("config key 'model.num_key_value_heads': ", num_key_value_heads,
         " does not divide model.num_attention_heads = ", num_attention_heads);
  if (attention_head_dim() % 2 != 0)
    fail("model head dimension ", attention_head_dim(), " must be even for rotary embeddings");
  if (!(rope_theta > 0)) fail("config key 'model.rope_theta': value ", rope_theta, " must be > 0");
  if (sliding_window < 0)
    fail("config key 'model.sliding_window': value ", sliding_window, " must be >= 0");
  if (sliding_window > 0 && architecture == Architecture::qwen2)
    fail(
        "config key 'model.sliding_window': Qwen2's sliding window is not supported (frugal runs "
        "Qwen2 with full attention)");
  if (!(rms_norm_eps > 0))
    fail("config key 'model.rms_norm_eps': value ", rms_norm_eps, " must be > 0");
  validate_rope_scaling(rope_scaling, "config keys 'model.rope_*'");
}

int64_t LlamaConfig::context_length() const {
  if (rope_scaling.type != RopeScalingType::dynamic) return max_position_embeddings;
  return static_cast<int64_t>(
      std::floor(rope_scaling.factor * static_cast<double>(max_position_embeddings)));
}

std::string hf_layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

std::vector<UnitSpec> llama_units(const LlamaConfig& c) {
  const int64_t h = c.hidden_size, d = c.attention_head_dim();
  const int64_t q_out = c.num_attention_heads * d, kv_out = c.num_key_value_heads * d;
  std::vector<UnitSpec> units;
  units.push_back({"embed", {{"model.embed_tokens.weight", {c.vocab_size, h}}}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = hf_layer_prefix(i);
    UnitSpec u{"layers." + std::to_string(i), {}};
    u.params.resize(kBlockParamCount);
    u.params[kInputNorm] = {p + "input_layernorm.weight", {h}};
    u.params[kQProj] = {p + "self_attn.q_proj.weight", {q_out, h}};
    u.params[kKProj] = {p + "self_attn.k_proj.weight", {kv_out, h}};
    u.params[kVProj] = {p + "self_attn.v_proj.weight", {kv_out, h}};
    u.params[kOProj] = {p + "self_attn.o_proj.weight", {h, q_out}};
    u.params[kPostAttentionNorm] = {p + "post_attention_layernorm.weight", {h}};
    u.params[kGateProj] = {p + "mlp.gate_proj.weight", {c.intermediate_size, h}};
    u.params[kUpProj] = {p + "mlp.up_proj.weight", {c.intermediate_size, h}};
    u.params[kDownProj] = {p + "mlp.down_proj.weight", {h, c.intermediate_size}};
    if (c.qkv_bias()) {
      u.params.push_back({p + "self_attn.q_proj.bias", {q_out}});
      u.params.push_back({p + "self_attn.k_proj.bias", {kv_out}});
      u.params.push_back({p + "self_attn.v_proj.bias", {kv_out}});
    }
    units.push_back(std::move(u));
  }
  UnitSpec head{"head", {{"model.norm.weight", {h}}}};
  if (!c.tie_word_embeddings) head.params.push_back({"lm_head.weight", {c.vocab_size, h}});
  units.push_back(std::move(head));
  return units;
}

LlamaConfig with_context_extension(const LlamaConfig& base, const RopeScaling& scaling) {
  FRUGAL_CHECK(scaling.type != RopeScalingType::none, "context extension without a scaling");
  if (base.rope_scaling.type != RopeScalingType::none)
    fail("config key 'model.rope_scaling': the model already has ",
         enum_name(base.rope_scaling.type),
         " rope scaling; extending a scaled model again is not supported");
  LlamaConfig c = base;
  c.rope_scaling = scaling;
  if (c.rope_scaling.original_max_position_embeddings == 0)
    c.rope_scaling.original_max_position_embeddings = base.max_position_embeddings;
  if (scaling.type != RopeScalingType::dynamic)
    c.max_position_embeddings = static_cast<int64_t>(std::floor(
        scaling.factor * static_cast<double>(c.rope_scaling.original_max_position_embeddings)));
  c.validate();
  return c;
}

nlohmann::json llama_config_to_json(const LlamaConfig& m) {
  nlohmann::json j = {{"hidden_size", m.hidden_size},
                      {"intermediate_size", m.intermediate_size},
                      {"num_hidden_layers", m.num_hidden_layers},
                      {"num_attention_heads", m.num_attention_heads},
                      {"num_key_value_heads", m.num_key_value_heads},
                      {"vocab_size", m.vocab_size},
                      {"head_dim", m.attention_head_dim()},
                      {"max_position_embeddings", m.max_position_embeddings},
                      {"rope_theta", m.rope_theta},
                      {"rms_norm_eps", m.rms_norm_eps},
                      {"tie_word_embeddings", m.tie_word_embeddings}};
  // Only when not the default: manifests written before these existed read the same.
  if (m.architecture != Architecture::llama) j["model_type"] = enum_name(m.architecture);
  if (m.sliding_window > 0) j["sliding_window"] = m.sliding_window;
  if (m.rope_scaling.type != RopeScalingType::none)
    j["rope_scaling"] = rope_scaling_to_hf_json(m.rope_scaling, m.max_position_embeddings);
  return j;
}

LlamaConfig llama_config_from_json(const nlohmann::json& j, const std::string& source) {
  LlamaConfig c;
  auto read = [&](const char* key, auto& field, bool required) {
    if (!j.contains(key)) {
      if (required) fail(source, ": missing key '", key, "'");
      return;
    }
    const nlohmann::json& value = j.at(key);
    using Field = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<Field, int64_t>) {
      // A size is a whole number: 64.7 is refused by name, not truncated to 64 (64.0 is 64).
      if (value.is_number_float()) {
        const double v = value.get<double>();
        if (!(std::floor(v) == v && std::fabs(v) < 9e18))
          fail(source, ": key '", key, "' has value ", value.dump(), ", not a whole number");
        field = static_cast<int64_t>(v);
        return;
      }
    }
    try {
      value.get_to(field);
    } catch (const nlohmann::json::exception&) {
      fail(source, ": key '", key, "' has value ", value.dump(), " of the wrong type");
    }
  };
  read("hidden_size", c.hidden_size, true);
  read("intermediate_size", c.intermediate_size, true);
  read("num_hidden_layers", c.num_hidden_layers, true);
  read("num_attention_heads", c.num_attention_heads, true);
  c.num_key_value_heads = c.num_attention_heads;
  read("num_key_value_heads", c.num_key_value_heads, false);
  read("vocab_size", c.vocab_size, true);
  read("max_position_embeddings", c.max_position_embeddings, false);
  read("rope_theta", c.rope_theta, false);
  read("rms_norm_eps", c.rms_norm_eps, false);
  read("tie_word_embeddings", c.tie_word_embeddings, false);
  if (j.contains("head_dim") && !j.at("head_dim").is_null()) read("head_dim", c.head_dim, false);
  if (j.contains("sliding_window") && !j.at("sliding_window").is_null())
    read("sliding_window", c.sliding_window, false);
  if (c.head_dim == c.hidden_size / std::max<int64_t>(1, c.num_attention_heads)) c.head_dim = 0;
  if (j.contains("model_type")) {
    std::string type;
    read("model_type", type, false);
    const std::optional<Architecture> a = enum_from_name<Architecture>(type);
    if (!a)
      fail(source, ": model_type '", type, "' is not one of ", enum_name_list<Architecture>());
    c.architecture = *a;
  }
  if (j.contains("rope_scaling"))
    c.rope_scaling =
        rope_scaling_from_hf_json(j.at("rope_scaling"), c.max_position_embeddings, source);
  c.validate();
  return c;
}

int64_t LlamaConfig::parameter_count() const {
  int64_t n = 0;
  for (const UnitSpec& u : llama_units(*this))
    for (const ParamSpec& p : u.params) n = checked_add(n, shape_numel(p.shape), "parameter count");
  return n;
}

}  // namespace frugal
