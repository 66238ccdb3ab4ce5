// The configuration agreement of the ranks.
#include "train/same_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace frugal {

std::string config_differences(const std::map<std::string, std::string>& mine,
                               const std::map<std::string, std::string>& reference,
                               const std::string& reference_name) {
  std::string differences;
  for (const auto& [key, value] : mine) {
    auto it = reference.find(key);
    const std::string other = it == reference.end() ? "(absent)" : it->second;
    if (other != value)
      differences += " " + key + " = '" + value + "' (" + reference_name + ": '" + other + "');";
  }
  return differences;
}

void check_same_config(Comm& world, const std::map<std::string, std::string>& resolved) {
  const std::string mine = nlohmann::json(resolved).dump();
  const std::string first = world.broadcast_string(mine, 0);
  std::string differences;
  if (mine != first)
    differences = config_differences(
        resolved, nlohmann::json::parse(first).get<std::map<std::string, std::string>>(),
        "rank 0");
  const bool any = world.all_reduce_max(differences.empty() ? 0 : 1) > 0;
  if (!differences.empty())
    fail("rank ", world.rank(), " runs a different configuration from rank 0:", differences);
  if (any)
    fail("rank ", world.rank(), ": another rank runs a different configuration (see its message)");
}

}  // namespace frugal
