// FP8 underflow and overflow rates for metrics.jsonl: of the values the casts of one kind of
// tensor in one layer saw since the last report, the share that flushed to zero (a non-zero
// value below the format's smallest subnormal after scaling) and the share that saturated.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace frugal {

struct CastTally {
  int64_t layer = 0;
  std::string kind;  // "activation", "weight", "gradient"
  int64_t values = 0, flushed = 0, saturated = 0;
};

// {"underflow": {"activation": [rate per layer], ...}, "overflow": {...}, "values": {...}},
// layers in order; a layer whose tensors saw no value has rate 0.
nlohmann::json fp8_rates_record(const std::vector<CastTally>& tallies);

}  // namespace frugal
