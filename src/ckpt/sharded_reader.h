// Reading row ranges of tensors that a checkpoint stores sharded by rows over W rank files:
// rank k holds rows [k * s, (k + 1) * s) of the row-padded tensor, s = ceil(rows / W) (the
// ZeRO-3 layout). This is how a run resumes on a different number of ranks, and how eval
// and export read a whole model back.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/h5_file.h"

namespace frugal {

class ShardedTensorReader {
 public:
  // `rank0_manifest`: the manifest of the step's rank 0 file; every file opened must agree
  // with it (CheckpointDir::open_rank).
  ShardedTensorReader(const CheckpointDir& dir, int64_t step, int world_size,
                      nlohmann::json rank0_manifest);

  // Rows [first, last) of dataset `name` whose full tensor has shape `full_shape`, as f32.
  Tensor read_rows(const std::string& name, const Shape& full_shape, int64_t first, int64_t last);
  Tensor read_full(const std::string& name, const Shape& full_shape) {
    return read_rows(name, full_shape, 0, full_shape.empty() ? 1 : full_shape[0]);
  }

 private:
  H5Reader& file(int rank);

  const CheckpointDir& dir_;
  int64_t step_;
  int world_size_;
  nlohmann::json rank0_manifest_;
  std::map<int, std::unique_ptr<H5Reader>> files_;
};

}  // namespace frugal
