// 8-bit optimizer state (optim.state_dtype = int8): which parameters get it, and how its
// tensors are named and row-sharded for checkpoints. The moments themselves are
// ops::QuantizedMoment (codes and a scale per block of a row, kernels/blockwise_int8.h).
#pragma once

#include <string>
#include <vector>

#include "core/stateful.h"
#include "ops/ops.h"

namespace frugal {

// Whether a parameter of this (whole) shape keeps 8-bit moments: a matrix of at least
// min_elements values (bitsandbytes' min_8bit_size, 4096: smaller tensors keep 32-bit state).
// Vectors (norm weights) keep 32-bit moments too: ZeRO-3 shards a vector by elements, so its
// blocks could not follow the shards, and they are small. Every rank decides alike (the whole
// shape, not its shard's).
bool int8_moments_apply(const Shape& full_shape, int64_t min_elements);

// Zero 8-bit moments for a shard buffer of `shape` (2-D; rows padded as the weight's), in
// bitsandbytes' blocks of 256 values within a row.
ops::QuantizedMoment int8_moment_zeros(const Shape& shape, Arena& arena);

// The checkpoint's view of a quantized moment named `name` (e.g. "optim/exp_avg/<hf name>"):
// "<name>.codes" (u8, saved as f32 whole numbers) with the weight's rows, and "<name>.absmax"
// [rows, blocks a row] with the same rows, so that a checkpoint saved on some number of ranks
// loads (and reshards) on any other as the weight does.
void append_quantized_state(std::vector<StateTensor>& state, const std::string& name,
                            const ops::QuantizedMoment& q, const RowShard& rows);

}  // namespace frugal
