// Helpers of the ring-attention tests (CPU ranks and GPUs): seeded inputs that every rank
// draws alike, and errors measured over the real (not padding) tokens of a zigzag slice.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "parallel/ring_attention.h"

namespace frugal::test {

// Uniform in [-amplitude, amplitude), the same on every rank for the same seed.
inline Tensor random_tensor(const Shape& shape, uint32_t seed, float amplitude) {
  Tensor t = Tensor::empty(shape, DType::f32);
  std::mt19937 rng(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = amplitude * (2.0f * float(rng() >> 8) / float(1 << 24) - 1.0f);
  return t;
}

// Largest |got - want| over the rows of a local slice that hold real tokens, relative to the
// largest |want| there. `want` is the reference in the same local layout.
inline double relative_error(const Tensor& got, const Tensor& want, const ZigzagLayout& layout,
                             int64_t batch) {
  REQUIRE(got.shape() == want.shape());
  const std::vector<int64_t> indices = zigzag_token_indices(layout);
  const int64_t row = got.numel() / got.size(0);
  double worst = 0, largest = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < layout.local_len(); ++i) {
      if (indices[size_t(i)] >= layout.seq_len) continue;
      const int64_t r = b * layout.local_len() + i;
      for (int64_t e = r * row; e < (r + 1) * row; ++e) {
        worst = std::max(worst, double(std::abs(got.data<float>()[e] - want.data<float>()[e])));
        largest = std::max(largest, double(std::abs(want.data<float>()[e])));
      }
    }
  return worst / std::max(largest, 1e-30);
}

// Largest |got - want| / (1 + |want|) of the log-sum-exp over real tokens: got [rows,
// local_len] of the slice against the reference want [rows, seq] of whole sequences
// (rows = batch * heads).
inline double lse_error(const Tensor& got, const Tensor& want, const ZigzagLayout& layout,
                        int64_t rows) {
  const std::vector<int64_t> indices = zigzag_token_indices(layout);
  double worst = 0;
  for (int64_t bh = 0; bh < rows; ++bh)
    for (int64_t i = 0; i < layout.local_len(); ++i)
      if (indices[size_t(i)] < layout.seq_len) {
        const float w = want.data<float>()[bh * layout.seq_len + indices[size_t(i)]];
        const float g = got.data<float>()[bh * layout.local_len() + i];
        worst = std::max(worst, double(std::abs(g - w)) / (1.0 + std::abs(w)));
      }
  return worst;
}

}  // namespace frugal::test
