// How ZeRO-3 splits one parameter over the ranks: a contiguous block of rows each, the row count
// padded to a multiple of the ranks, so one all-gather lands the whole matrix contiguously.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/stateful.h"
#include "core/tensor.h"
#include "model/llama_config.h"

namespace frugal {

// How one parameter is split: rows [rank * shard_rows, (rank + 1) * shard_rows) of the
// padded [rows_padded, row_len] matrix live on `rank`. 1-D weights are columns of length 1.
struct ShardLayout {
  std::string name;
  Shape shape;  // the full parameter's shape
  int64_t rows = 0, row_len = 0, rows_padded = 0, shard_rows = 0;

  Shape shard_shape() const;   // [shard_rows, ...row dims]
  Shape padded_shape() const;  // [rows_padded, ...row dims]
  // The real (unpadded) rows of the full parameter that `rank` holds: [first, last).
  int64_t first_row(int rank) const { return std::min(rows, rank * shard_rows); }
  int64_t last_row(int rank) const { return std::min(rows, (rank + 1) * shard_rows); }
  RowShard rows_of(int rank) const { return {shape, first_row(rank), last_row(rank)}; }
};
ShardLayout shard_layout(const ParamSpec& spec, int ranks);

}  // namespace frugal
