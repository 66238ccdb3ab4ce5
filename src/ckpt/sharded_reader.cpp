// Row ranges across rank files.
#include "ckpt/sharded_reader.h"

#include <algorithm>
#include <cstring>

namespace frugal {

ShardedTensorReader::ShardedTensorReader(const CheckpointDir& dir, int64_t step, int world_size,
                                         nlohmann::json rank0_manifest)
    : dir_(dir), step_(step), world_size_(world_size), rank0_manifest_(std::move(rank0_manifest)) {
  if (world_size < 1) fail("checkpoint step ", step, ": world size ", world_size, " in manifest");
}

H5Reader& ShardedTensorReader::file(int rank) {
  auto it = files_.find(rank);
  if (it == files_.end())
    it =
        files_
            .emplace(rank, std::make_unique<H5Reader>(dir_.open_rank(step_, rank, rank0_manifest_)))
            .first;
  return *it->second;
}

Tensor ShardedTensorReader::read_rows(const std::string& name, const Shape& full_shape,
                                      int64_t first, int64_t last) {
  const int64_t rows = full_shape.empty() ? 1 : full_shape[0];
  const int64_t row_len = rows ? shape_numel(full_shape) / rows : 0;
  const int64_t shard_rows = (rows + world_size_ - 1) / world_size_;
  FRUGAL_CHECK(0 <= first && first <= last && last <= rows, "rows [", first, ", ", last, ") of ",
               name);
  Shape out_shape = full_shape.empty() ? Shape{1} : full_shape;
  out_shape[0] = last - first;
  Tensor out = Tensor::empty(out_shape);
  for (int64_t row = first; row < last;) {
    const int rank = static_cast<int>(row / shard_rows);
    const int64_t shard_first = rank * shard_rows;
    const int64_t take = std::min(last, shard_first + shard_rows) - row;
    H5Reader& f = file(rank);
    if (!f.has(name)) fail("checkpoint file '", f.path(), "' has no tensor '", name, "'");
    Tensor shard = f.read_tensor(name);
    if (shard.dtype() != DType::f32 || shard.numel() != shard_rows * row_len)
      fail("checkpoint file '", f.path(), "': tensor '", name, "' has shape ",
           shape_string(shard.shape()), ", expected ", shard_rows, " rows of ", row_len,
           " (a shard of ", shape_string(full_shape), " over ", world_size_, " ranks)");
    std::memcpy(out.data<float>() + (row - first) * row_len,
                shard.data<float>() + (row - shard_first) * row_len,
                size_t(take * row_len) * sizeof(float));
    row += take;
  }
  return out.view(last - first == rows && full_shape.empty() ? Shape{} : out_shape);
}

}  // namespace frugal
