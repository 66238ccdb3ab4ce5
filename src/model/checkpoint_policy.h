// Activation checkpointing: what a transformer block keeps from its forward for the backward.
//   none       keep every intermediate (fastest, most memory)
//   selective  keep the matmul, rotary and attention outputs; recompute norms and SwiGLU
//   full       keep only the block input; recompute the whole block forward
#pragma once

#include <string>

namespace frugal {

enum class CheckpointPolicy { none, selective, full };

CheckpointPolicy checkpoint_policy_from_name(const std::string& name);  // throws Error
std::string checkpoint_policy_name(CheckpointPolicy policy);

}  // namespace frugal
