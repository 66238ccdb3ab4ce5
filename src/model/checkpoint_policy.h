// Activation checkpointing: what a transformer block keeps from its forward for the backward.
//   none       keep every intermediate (fastest, most memory)
//   selective  keep the matmul, rotary and attention outputs; recompute norms and SwiGLU
//   full       keep only the block input; recompute the whole block forward
#pragma once

#include <string>

#include "core/enum_names.h"

namespace frugal {

enum class CheckpointPolicy { none, selective, full };

inline std::span<const EnumName<CheckpointPolicy>> enum_names(CheckpointPolicy) {
  static constexpr EnumName<CheckpointPolicy> names[] = {{CheckpointPolicy::none, "none"},
                                                         {CheckpointPolicy::selective, "selective"},
                                                         {CheckpointPolicy::full, "full"}};
  return names;
}

inline std::string checkpoint_policy_name(CheckpointPolicy policy) {
  return std::string(enum_name(policy));
}

}  // namespace frugal
