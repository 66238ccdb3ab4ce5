// Helpers for tests that drive an optimizer directly on whole (one-rank) tensors.
#pragma once

#include <string>

#include "core/random.h"
#include "core/stateful.h"
#include "core/tensor.h"
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

// A [rows, cols] f32 matrix of uniform values in [-1, 1) drawn from `seed`.
inline Tensor random_matrix(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::f32);
  uint64_t state = seed;
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(2.0 * uniform01(state) - 1.0);
  return t;
}

}  // namespace frugal::test
