// Helpers for tests that drive an optimizer directly on whole (one-rank) tensors.
#pragma once

#include <string>

#include "core/tensor.h"
#include "core/stateful.h"
#include "model/parameter_provider.h"

namespace frugal::test {

// `param` as a one-rank shard: all of its rows, with a zeroed fp32 gradient of its shape.
inline TrainableShard whole_shard(const std::string& name, const Tensor& param) {
  TrainableShard s;
  s.name = name;
  s.param = param;
  s.grad = Tensor::zeros(param.shape(), DType::f32);
  s.rows = whole_rows(param.shape(), false);
  return s;
}

}  // namespace frugal::test
