// LoRA's units and names; the math is in llama_block.cpp (project / project_backward).
#include "model/lora.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace frugal {

namespace {

struct Target {
  int param;
  const char* name;
};
constexpr Target kTargets[] = {
    {kQProj, "q_proj"},       {kKProj, "k_proj"},   {kVProj, "v_proj"},      {kOProj, "o_proj"},
    {kGateProj, "gate_proj"}, {kUpProj, "up_proj"}, {kDownProj, "down_proj"}};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

bool LoraConfig::adapts(int block_param) const {
  return enabled() && std::find(targets.begin(), targets.end(), block_param) != targets.end();
}

int LoraConfig::a_index(int block_param) const {
  int index = kBlockParamCount;
  for (const Target& t : kTargets) {  // adapters follow the base params in kTargets order
    if (!adapts(t.param)) continue;
    if (t.param == block_param) return index;
    index += 2;
  }
  return -1;
}

std::vector<int> lora_targets_from_names(const std::string& list) {
  return projections_from_names(list, "lora.targets");
}

std::vector<int> projections_from_names(const std::string& list, const std::string& key) {
  if (list == "all") {
    std::vector<int> all;
    for (const Target& t : kTargets) all.push_back(t.param);
    return all;
  }
  std::vector<int> targets;
  std::stringstream in(list);
  std::string name;
  while (std::getline(in, name, ',')) {
    const auto it = std::find_if(std::begin(kTargets), std::end(kTargets),
                                 [&](const Target& t) { return name == t.name; });
    if (it == std::end(kTargets))
      fail("config key '", key, "': '", name, "' is not one of all, q_proj, k_proj, v_proj, ",
           "o_proj, gate_proj, up_proj, down_proj (a comma-separated list)");
    if (std::find(targets.begin(), targets.end(), it->param) == targets.end())
      targets.push_back(it->param);
  }
  if (targets.empty()) fail("config key '", key, "': no projection named");
  return targets;
}

std::string lora_target_names(const std::vector<int>& targets) {
  std::string names;
  for (const Target& t : kTargets)
    if (std::find(targets.begin(), targets.end(), t.param) != targets.end()) {
      if (!names.empty()) names += ',';
      names += t.name;
    }
  return names;
}

std::vector<UnitSpec> lora_units(const LlamaConfig& config, const LoraConfig& lora) {
  FRUGAL_CHECK(lora.enabled(), "lora_units without a rank");
  std::vector<UnitSpec> units = llama_units(config);
  for (UnitSpec& unit : units) {
    for (ParamSpec& p : unit.params) p.trainable = false;
    if (unit.name.rfind("layers.", 0) != 0) continue;
    std::vector<ParamSpec> adapters;
    for (const Target& t : kTargets) {
      if (!lora.adapts(t.param)) continue;
      const ParamSpec& base = unit.params[t.param];
      const std::string stem =
          base.name.substr(0, base.name.size() - std::string(".weight").size());
      const int64_t out = base.shape[0], in = base.shape[1];
      adapters.push_back({stem + ".lora_A.weight", {lora.rank, in}, true});
      adapters.push_back({stem + ".lora_B.weight", {out, lora.rank}, true});
    }
    unit.params.insert(unit.params.end(), adapters.begin(), adapters.end());
  }
  return units;
}

bool is_block_projection(const std::string& name) {
  if (name.rfind("model.layers.", 0) != 0) return false;
  for (const Target& t : kTargets)
    if (ends_with(name, std::string(".") + t.name + ".weight")) return true;
  return false;
}

int block_projection_index(const std::string& name) {
  if (name.rfind("model.layers.", 0) != 0) return -1;
  for (const Target& t : kTargets)
    if (ends_with(name, std::string(".") + t.name + ".weight")) return t.param;
  return -1;
}

bool is_lora_a(const std::string& name) { return ends_with(name, ".lora_A.weight"); }
bool is_lora_b(const std::string& name) { return ends_with(name, ".lora_B.weight"); }

}  // namespace frugal
