// Every `frugal train` configuration key, declared once: its name, the field it sets, the
// values it allows and a line of doc. app/options.cpp builds the command line and .cfg parsing
// and --help from it, TrainConfig::validate its single-key rules, TrainConfig::resolve the
// resolved map, and `frugal train --help-keys-markdown` doc/usage.md's key table.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "config/train_config.h"

namespace frugal {

// What a key's value must satisfy on its own; rules between keys are code in
// TrainConfig::validate. Numbers: a bound; texts: a format.
struct KeyRule {
  enum class Kind {
    any,
    positive,     // > 0, said "positive" (whole numbers)
    at_least,     // >= lo
    above,        // > lo
    closed_open,  // [lo, hi)
    closed,       // [lo, hi]
    path,         // a file or directory (empty: none)
    size,         // bytes with an optional unit: 0, 512MiB, 24GiB (core/log.h's parse_bytes)
    lora_targets  // all, or a comma-separated list of projections (model/lora.h's names)
  };
  Kind kind = Kind::any;
  double lo = 0, hi = 0;
};

inline constexpr KeyRule kAny{};
inline constexpr KeyRule kPositive{KeyRule::Kind::positive};
inline constexpr KeyRule kPath{KeyRule::Kind::path};
inline constexpr KeyRule kSize{KeyRule::Kind::size};
inline constexpr KeyRule kLoraTargets{KeyRule::Kind::lora_targets};
constexpr KeyRule at_least(double lo) { return {KeyRule::Kind::at_least, lo}; }
constexpr KeyRule above(double lo) { return {KeyRule::Kind::above, lo}; }
constexpr KeyRule closed_open(double lo, double hi) { return {KeyRule::Kind::closed_open, lo, hi}; }
constexpr KeyRule closed(double lo, double hi) { return {KeyRule::Kind::closed, lo, hi}; }

// The field a key sets; a new mode enum joins the list.
using KeyField =
    std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, TrainType*, CheckpointPolicy*,
                 Offload*, StateDType*, MasterDType*, Bf16Rounding*, DeviceChoice*, OptimizerType*,
                 GaloreProjectorKind*, MomentsOnRefresh*, GaloreRefresh*,
                 GaloreProjectionPrecision*, Fp8Recipe*, RopeScalingType*, DivergenceAction*,
                 ActivationOffload*, TrainOn*, Packing*, LongDocuments*,
                 // optim.update and optim.per_layer_clip (per-layer updates)
                 UpdateTiming*, PerLayerClip*>;

struct ConfigKey {
  std::string name;  // "train.lr"
  KeyField field;
  KeyRule rule;
  std::string doc;  // one line, for --help and doc/usage.md

  // The value in force as resolved, --help and the docs print it: the shortest text that reads
  // back as the same value ("0.003"), true / false, a mode's name.
  std::string text() const;
  // Sets the field from a .cfg or command-line value; throws Error naming the key:
  // "config key 'train.lr': value 'abc' is not a number".
  void set(const std::string& text) const;
  // Throws Error naming the key when the value breaks the rule:
  // "config key 'train.lr': value 0 must be > 0".
  void check() const;
  // What the rule allows, for --help and the docs: "> 0", "[0, 1)", "full, lora, qlora,
  // hqq_lora", "true, false".
  std::string allowed() const;
  std::string section() const { return name.substr(0, name.find('.')); }
};

struct ConfigSection {
  std::string name;   // "train", the .cfg section [train] and the keys' prefix
  std::string title;  // "the run"
};

// [model] ... [monitor], in the order of --help and the docs.
const std::vector<ConfigSection>& config_sections();

// Every key, in the order of --help and the docs, each pointing into `config`.
std::vector<ConfigKey> config_keys(TrainConfig& config);

// doc/usage.md's key table from the defaults: a header and one row per key,
// "| `train.lr` | 0.003 | > 0 | peak learning rate |".
std::string config_keys_markdown();

}  // namespace frugal
