// The row split of one parameter over the ranks (ZeRO-3).
#include "parallel/shard_layout.h"

namespace frugal {

Shape ShardLayout::shard_shape() const {
  Shape s = shape.empty() ? Shape{1} : shape;
  s[0] = shard_rows;
  return s;
}

Shape ShardLayout::padded_shape() const {
  Shape s = shape.empty() ? Shape{1} : shape;
  s[0] = rows_padded;
  return s;
}

ShardLayout shard_layout(const ParamSpec& spec, int ranks) {
  ShardLayout l;
  l.name = spec.name;
  l.shape = spec.shape;
  l.rows = spec.shape.empty() ? 1 : spec.shape[0];
  l.row_len = l.rows ? shape_numel(spec.shape) / l.rows : 0;
  l.shard_rows = (l.rows + ranks - 1) / ranks;
  l.rows_padded = l.shard_rows * ranks;
  return l;
}

}  // namespace frugal
