// Integers read from JSON that others wrote (checkpoint manifests and markers, config.json).
// nlohmann's get<int64_t>() casts whatever number it finds: a float is truncated (3.5 becomes 3)
// and one beyond the type's range is undefined behaviour; a negative number read as unsigned
// wraps around. json_integer accepts an integer in [lo, hi] and nothing else.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace frugal {

// `value` as an integer in [lo, hi]; otherwise an Error naming `what` and the value.
inline int64_t json_integer(const nlohmann::json& value, const std::string& what,
                            int64_t lo = std::numeric_limits<int64_t>::min(),
                            int64_t hi = std::numeric_limits<int64_t>::max()) {
  if (!value.is_number_integer()) fail(what, " is ", value.dump(), ", not an integer");
  // A parsed non-negative integer is stored unsigned, and may not fit int64.
  const bool in_range = value.is_number_unsigned()
                            ? hi >= 0 && value.get<uint64_t>() <= uint64_t(hi) &&
                                  (lo <= 0 || value.get<uint64_t>() >= uint64_t(lo))
                            : value.get<int64_t>() >= lo && value.get<int64_t>() <= hi;
  if (!in_range) fail(what, " is ", value.dump(), ", outside [", lo, ", ", hi, "]");
  return value.is_number_unsigned() ? int64_t(value.get<uint64_t>()) : value.get<int64_t>();
}

}  // namespace frugal
