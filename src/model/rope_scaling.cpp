// The rotary frequency tables of transformers' modeling_rope_utils.py, computed in double and
// rounded once to float (transformers computes them in float32: the tables agree to an ulp).
#include "model/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>

#include "core/error.h"

namespace frugal {

namespace {

bool present(const nlohmann::json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null();
}

double number_key(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.at(key).is_number())
    fail(source, ": rope_scaling key '", key, "' has value ", j.at(key).dump(),
         ", expected a number");
  return j.at(key).get<double>();
}

// 1 / theta^(2i/d) for the d/2 pairs, in double.
std::vector<double> plain_inv_freq(double theta, int64_t head_dim) {
  std::vector<double> inv(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i)
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  return inv;
}

// YaRN's attention factor from the scale: 0.1 * mscale * ln(scale) + 1 (1 below scale 1).
double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The pair index at which a wavelength makes `rotations` turns over the original context.
double yarn_correction_dim(double rotations, int64_t dim, double base, int64_t original) {
  return (static_cast<double>(dim) *
          std::log(static_cast<double>(original) / (rotations * 2 * std::numbers::pi))) /
         (2 * std::log(base));
}

std::vector<double> yarn_inv_freq(const RopeScaling& s, double theta, int64_t dim,
                                  int64_t original) {
  const std::vector<double> extrapolation = plain_inv_freq(theta, dim);
  double low = yarn_correction_dim(s.beta_fast, dim, theta, original);
  double high = yarn_correction_dim(s.beta_slow, dim, theta, original);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  std::vector<double> inv(extrapolation.size());
  for (size_t i = 0; i < inv.size(); ++i) {
    // Pairs below `low` turn fast (keep their frequency), above `high` slowly (interpolated).
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;
    inv[i] = extrapolation[i] / s.factor * (1.0 - keep) + extrapolation[i] * keep;
  }
  return inv;
}

std::vector<double> llama3_inv_freq(const RopeScaling& s, double theta, int64_t dim,
                                    int64_t original) {
  std::vector<double> inv = plain_inv_freq(theta, dim);
  const double old_len = static_cast<double>(original);
  const double low_freq_wavelen = old_len / s.low_freq_factor;
  const double high_freq_wavelen = old_len / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen < high_freq_wavelen) continue;  // high frequencies: unchanged
    if (wavelen > low_freq_wavelen) {           // low frequencies: interpolated by the factor
      f /= s.factor;
      continue;
    }
    // In between: a smooth blend of the two.
    const double smooth =
        (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    f = (1 - smooth) * f / s.factor + smooth * f;
  }
  return inv;
}

}  // namespace

void validate_rope_scaling(const RopeScaling& s, const std::string& where) {
  if (s.type == RopeScalingType::none) return;
  const std::string type(enum_name(s.type));
  if (!(s.factor >= 1))
    fail(where, ": rope scaling factor ", s.factor, " must be >= 1 for ", type, " scaling");
  if (s.original_max_position_embeddings < 0)
    fail(where, ": rope original_max_position_embeddings ", s.original_max_position_embeddings,
         " must be >= 0");
  if (s.type == RopeScalingType::llama3 &&
      !(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor))
    fail(where, ": llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor, got ",
         s.low_freq_factor, " and ", s.high_freq_factor);
  if (s.type == RopeScalingType::yarn && !(s.beta_fast > 0 && s.beta_slow > 0))
    fail(where, ": yarn rope scaling needs beta_fast and beta_slow > 0, got ", s.beta_fast, " and ",
         s.beta_slow);
  if (!(s.attention_factor >= 0))
    fail(where, ": yarn attention_factor ", s.attention_factor, " must be > 0 (0: derived)");
}

RopeScaling rope_scaling_from_hf_json(const nlohmann::json& j, int64_t max_position_embeddings,
                                      const std::string& source) {
  RopeScaling s;
  if (j.is_null()) return s;
  if (!j.is_object())
    fail(source, ": rope_scaling has value ", j.dump(), ", expected an object or null");
  std::string type = "default";
  for (const char* key : {"type", "rope_type"})  // rope_type wins, as in transformers
    if (present(j, key)) {
      if (!j.at(key).is_string())
        fail(source, ": rope_scaling key '", key, "' has value ", j.at(key).dump(),
             ", expected a string");
      type = j.at(key).get<std::string>();
    }
  if (type == "default") return s;
  const std::optional<RopeScalingType> parsed = enum_from_name<RopeScalingType>(type);
  if (!parsed || *parsed == RopeScalingType::none)
    fail(source, ": rope_scaling of type '", type, "' (", j.dump(),
         ") is not supported: frugal implements default, linear, dynamic, yarn and llama3");
  s.type = *parsed;
  auto read = [&](const char* key, double& field, bool required) {
    if (present(j, key))
      field = number_key(j, key, source);
    else if (required)
      fail(source, ": rope_scaling of type '", type, "' needs the key '", key, "'");
  };
  const bool yarn = s.type == RopeScalingType::yarn, llama3 = s.type == RopeScalingType::llama3;
  read("factor", s.factor, !yarn);
  if (present(j, "original_max_position_embeddings")) {
    double original = 0;
    read("original_max_position_embeddings", original, false);
    if (!(original >= 1 && std::floor(original) == original))
      fail(source, ": rope_scaling key 'original_max_position_embeddings' has value ", original,
           ", expected a positive whole number");
    s.original_max_position_embeddings = static_cast<int64_t>(original);
  } else if (llama3) {
    fail(source,
         ": rope_scaling of type 'llama3' needs the key 'original_max_position_embeddings'");
  }
  if (llama3) {
    read("low_freq_factor", s.low_freq_factor, true);
    read("high_freq_factor", s.high_freq_factor, true);
  }
  if (yarn) {
    // transformers: beta_fast / beta_slow "or" their defaults (0 and null mean the default).
    if (present(j, "beta_fast") && number_key(j, "beta_fast", source) != 0)
      read("beta_fast", s.beta_fast, false);
    if (present(j, "beta_slow") && number_key(j, "beta_slow", source) != 0)
      read("beta_slow", s.beta_slow, false);
    read("mscale", s.mscale, false);
    read("mscale_all_dim", s.mscale_all_dim, false);
    read("attention_factor", s.attention_factor, false);
    if (present(j, "truncate")) {
      if (!j.at("truncate").is_boolean())
        fail(source, ": rope_scaling key 'truncate' has value ", j.at("truncate").dump(),
             ", expected true or false");
      s.truncate = j.at("truncate").get<bool>();
    }
    // transformers: without a factor, YaRN stretches the original context to the new one.
    if (!present(j, "factor")) {
      if (s.original_max_position_embeddings == 0)
        fail(source, ": rope_scaling of type 'yarn' needs 'factor' or ",
             "'original_max_position_embeddings'");
      s.factor = static_cast<double>(max_position_embeddings) /
                 static_cast<double>(s.original_max_position_embeddings);
    }
  }
  validate_rope_scaling(s, source);
  return s;
}

nlohmann::json rope_scaling_to_hf_json(const RopeScaling& s, int64_t max_position_embeddings) {
  if (s.type == RopeScalingType::none) return nullptr;
  const int64_t original = s.original_max_position_embeddings ? s.original_max_position_embeddings
                                                              : max_position_embeddings;
  nlohmann::json j = {{"rope_type", enum_name(s.type)}, {"factor", s.factor}};
  switch (s.type) {
    case RopeScalingType::llama3:
      j["low_freq_factor"] = s.low_freq_factor;
      j["high_freq_factor"] = s.high_freq_factor;
      j["original_max_position_embeddings"] = original;
      break;
    case RopeScalingType::yarn:
      j["original_max_position_embeddings"] = original;
      j["beta_fast"] = s.beta_fast;
      j["beta_slow"] = s.beta_slow;
      j["truncate"] = s.truncate;
      if (s.attention_factor != 0) j["attention_factor"] = s.attention_factor;
      if (s.mscale != 0) j["mscale"] = s.mscale;
      if (s.mscale_all_dim != 0) j["mscale_all_dim"] = s.mscale_all_dim;
      break;
    default:
      break;
  }
  return j;
}

ops::RotaryFrequencies rotary_frequencies(const RopeScaling& s, double theta, int64_t head_dim,
                                          int64_t max_position_embeddings,
                                          int64_t sequence_length) {
  const int64_t original = s.original_max_position_embeddings ? s.original_max_position_embeddings
                                                              : max_position_embeddings;
  std::vector<double> inv;
  double attention_scaling = 1.0;
  switch (s.type) {
    case RopeScalingType::none:
      inv = plain_inv_freq(theta, head_dim);
      break;
    case RopeScalingType::linear:
      inv = plain_inv_freq(theta, head_dim);
      for (double& f : inv) f /= s.factor;
      break;
    case RopeScalingType::dynamic: {
      // The base grows once the sequence passes max_position_embeddings (NTK-aware scaling).
      double base = theta;
      if (sequence_length > max_position_embeddings) {
        const double d = static_cast<double>(head_dim);
        const double ratio = s.factor * static_cast<double>(sequence_length) /
                                 static_cast<double>(max_position_embeddings) -
                             (s.factor - 1);
        // transformers holds this base as a float32 tensor.
        base = static_cast<float>(theta * std::pow(ratio, d / (d - 2)));
      }
      inv = plain_inv_freq(base, head_dim);
      break;
    }
    case RopeScalingType::yarn:
      inv = yarn_inv_freq(s, theta, head_dim, original);
      if (s.attention_factor != 0)
        attention_scaling = s.attention_factor;
      else if (s.mscale != 0 && s.mscale_all_dim != 0)
        attention_scaling =
            yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
      else
        attention_scaling = yarn_mscale(s.factor, 1.0);
      break;
    case RopeScalingType::llama3:
      inv = llama3_inv_freq(s, theta, head_dim, original);
      break;
  }
  ops::RotaryFrequencies r;
  r.inv_freq.assign(inv.begin(), inv.end());
  r.attention_scaling = static_cast<float>(attention_scaling);
  return r;
}

}  // namespace frugal
