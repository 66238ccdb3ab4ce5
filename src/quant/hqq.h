// HQQ 4-bit (Half-Quadratic Quantization, Badri & Shaji 2023): asymmetric codes per group of 64
// with a scale and a zero point, the zero point refined by half-quadratic splitting against an
// l_p (p < 1) reconstruction loss. Needs no calibration data.
//
// Layout: codes[i / 2] holds element i's code in 0..15, the even element in the high nibble (as
// NF4); group g covers elements 64 g .. 64 g + 63 of the flat tensor (64 consecutive elements
// of a row). Dequantization: w = (code - zeros[g]) * scales[g].
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/tensor.h"

namespace frugal {

constexpr int64_t kHqqGroupSize = 64;

// The HQQ library's defaults (hqq/core/optimize.py, optimize_weights_proximal_legacy).
struct HqqOptions {
  bool optimize = true;  // false: plain min-max round-to-nearest
  float lp_norm = 0.7f;  // p of the sparsity-promoting loss |W - dequant(W)|_p^p
  float beta = 10.0f;    // initial penalty of the half-quadratic splitting
  float kappa = 1.01f;   // beta grows by this factor every iteration
  int iterations = 20;   // at most; stops early once the mean |W - dequant(W)| stops improving
  // When the matrix's rows are split over ranks (ZeRO-3): sums a rank's error over all of
  // them, so every rank stops at the iteration one process holding the whole matrix would.
  // Null: this process holds the whole matrix.
  std::function<double(double)> global_sum;
};

struct HqqWeight {
  Shape shape;    // the original shape; the last axis (a row) is a multiple of 64
  Tensor codes;   // u8 [numel / 2]
  Tensor scales;  // f32 [numel / 64]
  Tensor zeros;   // f32 [numel / 64], in code units (not rounded)

  int64_t numel() const { return shape_numel(shape); }
  int64_t groups() const { return numel() / kHqqGroupSize; }
};

// Quantizes w (f32, contiguous). Fails, naming `name`, on rows whose length is not a multiple of
// 64 (row shards must hold whole groups) and on inf or NaN (naming the group).
HqqWeight hqq_quantize(const Tensor& w, const std::string& name, const HqqOptions& options = {});
HqqWeight hqq_quantize(const float* w, const Shape& shape, const std::string& name,
                       const HqqOptions& options = {});

// out[numel()] = the dequantized weight, fp32 (OpenMP).
void hqq_dequantize(const HqqWeight& q, float* out);
Tensor hqq_dequantize(const HqqWeight& q);

}  // namespace frugal
