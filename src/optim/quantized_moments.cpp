// Which parameters keep 8-bit moments, and their checkpointed tensors.
#include "optim/quantized_moments.h"

#include "kernels/blockwise_int8.h"

namespace frugal {

bool int8_moments_apply(const Shape& full_shape, int64_t min_elements) {
  return full_shape.size() == 2 && shape_numel(full_shape) >= min_elements;
}

ops::QuantizedMoment int8_moment_zeros(const Shape& shape, Arena& arena) {
  FRUGAL_CHECK(shape.size() == 2, "8-bit moments of a tensor of shape ", shape_string(shape));
  return ops::quantized_moment_zeros(shape[0], shape[1], kInt8StateBlock, arena);
}

void append_quantized_state(std::vector<StateTensor>& state, const std::string& name,
                            const ops::QuantizedMoment& q, const RowShard& rows) {
  state.push_back({name + ".codes", q.codes, rows});
  RowShard scale_rows = rows;
  const int64_t cols = rows.full_shape.size() == 2 ? rows.full_shape[1] : 0;
  scale_rows.full_shape = {rows.rows(), (cols + q.block - 1) / q.block};
  state.push_back({name + ".absmax", q.absmax, scale_rows});
}

}  // namespace frugal
