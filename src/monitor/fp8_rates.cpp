// FP8 underflow and overflow rates; see fp8_rates.h.
#include "monitor/fp8_rates.h"

#include <algorithm>

namespace frugal {

nlohmann::json fp8_rates_record(const std::vector<CastTally>& tallies) {
  int64_t layers = 0;
  for (const CastTally& t : tallies) layers = std::max(layers, t.layer + 1);
  nlohmann::json out = {{"underflow", nlohmann::json::object()},
                        {"overflow", nlohmann::json::object()},
                        {"values", nlohmann::json::object()}};
  for (const CastTally& t : tallies) {
    for (const char* field : {"underflow", "overflow", "values"})
      if (!out[field].contains(t.kind))
        out[field][t.kind] = std::vector<double>(size_t(layers), 0.0);
    const double n = double(std::max<int64_t>(t.values, 1));
    out["underflow"][t.kind][size_t(t.layer)] = double(t.flushed) / n;
    out["overflow"][t.kind][size_t(t.layer)] = double(t.saturated) / n;
    out["values"][t.kind][size_t(t.layer)] = double(t.values);
  }
  return out;
}

}  // namespace frugal
