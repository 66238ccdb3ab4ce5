// HQQ 4-bit: min-max initialisation of scale and zero per group of 64, then the half-quadratic
// refinement of the zero point (hqq/core/optimize.py, optimize_weights_proximal_legacy):
//   W_q = clamp(round(W s + z), 0, 15)        s: the inverse scale, z: the zero point
//   W_r = (W_q - z) / s
//   W_e = shrink_p(W - W_r, beta)              the l_p proximal step on the error
//   z   = mean_group(W_q - (W - W_e) s)        the closed-form zero for that error
//   beta *= kappa
// The loop stops at the first iteration whose mean |W - W_r| over the whole matrix does not
// improve. One deliberate difference from the library: it returns the zero point that was just
// updated when it stops (one step past the best); this keeps the best one, so the result is
// never worse than the min-max start.
#include "quant/hqq.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/quant.h"

namespace frugal {

namespace {

constexpr float kMaxCode = 15.0f;
constexpr float kMaxInverseScale = 2e4f;  // the library's clamp; a constant group gets it
constexpr int64_t kParallelGroups = 64;

// sign(x) max(|x| - |x|^(p-1) / beta, 0): the proximal operator of |x|^p / beta (approximate,
// as in the paper); 1e-8 keeps |x|^(p-1) finite at 0.
inline float shrink_lp(float x, float beta, float p) {
  const float ax = std::fabs(x);
  const float shrunk = std::max(ax - std::pow(ax + 1e-8f, p - 1.0f) / beta, 0.0f);
  return std::copysign(shrunk, x);
}

inline float quantize_one(float w, float inv_scale, float zero) {
  return std::clamp(std::nearbyint(w * inv_scale + zero), 0.0f, kMaxCode);  // ties to even
}

// One step for group x: the sum of |W - W_r| with the current zero, and the updated zero.
double hqq_step(const float* x, float inv_scale, float zero, float beta, float p,
                float* next_zero) {
  double abs_err = 0.0;
  double zero_sum = 0.0;
  for (int64_t i = 0; i < kHqqGroupSize; ++i) {
    const float wq = quantize_one(x[i], inv_scale, zero);
    const float wr = (wq - zero) / inv_scale;
    const float we = shrink_lp(x[i] - wr, beta, p);
    zero_sum += wq - (x[i] - we) * inv_scale;
    abs_err += std::fabs(x[i] - wr);
  }
  *next_zero = static_cast<float>(zero_sum / kHqqGroupSize);
  return abs_err;
}

}  // namespace

HqqWeight hqq_quantize(const Tensor& w, const std::string& name, const HqqOptions& options) {
  if (w.dtype() != DType::f32)
    fail("hqq: tensor '", name, "' has dtype ", dtype_name(w.dtype()), "; expected f32");
  return hqq_quantize(w.data<float>(), w.shape(), name, options);
}

HqqWeight hqq_quantize(const float* w, const Shape& shape, const std::string& name,
                       const HqqOptions& options) {
  if (shape.empty()) fail("hqq: tensor '", name, "' is a scalar; HQQ quantizes matrices");
  if (shape.back() % kHqqGroupSize != 0)
    fail("hqq: tensor '", name, "' of shape ", shape_string(shape), ": rows of ", shape.back(),
         " elements are not a multiple of the group size ", kHqqGroupSize,
         " (each row must split into whole groups so that row shards carry whole groups)");
  HqqWeight q;
  q.shape = shape;
  const int64_t n = q.numel(), groups = q.groups();
  q.codes = Tensor::empty({n / 2}, DType::u8);
  q.scales = Tensor::empty({groups}, DType::f32);
  q.zeros = Tensor::empty({groups}, DType::f32);
  std::vector<float> inv_scale(static_cast<size_t>(groups));
  float* zero = q.zeros.data<float>();

  // Min-max start: w s + z maps [min, max] onto [0, 15].
  int64_t bad_group = groups;
#pragma omp parallel for schedule(static) reduction(min : bad_group) if (groups >= kParallelGroups)
  for (int64_t g = 0; g < groups; ++g) {
    const float* x = w + g * kHqqGroupSize;
    float lo = x[0], hi = x[0];
    bool finite = true;
    for (int64_t i = 0; i < kHqqGroupSize; ++i) {
      finite = finite && std::isfinite(x[i]);
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    if (!finite) {
      bad_group = std::min(bad_group, g);
      continue;
    }
    inv_scale[g] = std::min(kMaxCode / (hi - lo), kMaxInverseScale);  // hi == lo: inf -> clamp
    zero[g] = -lo * inv_scale[g];
  }
  if (bad_group < groups) {
    const int64_t row = bad_group * kHqqGroupSize / shape.back();
    const int64_t col = bad_group * kHqqGroupSize % shape.back();
    fail("hqq: tensor '", name, "' has inf or NaN in group ", bad_group, " (row ", row,
         ", columns ", col, "..", col + kHqqGroupSize - 1, "); refusing to quantize it");
  }

  // With global_sum every rank holding rows of the matrix runs the same iterations (also one
  // that holds none): the stopping test is on the whole matrix's error.
  if (options.optimize && (groups > 0 || options.global_sum)) {
    std::vector<float> next_zero(static_cast<size_t>(groups));
    std::vector<float> best_zero(zero, zero + groups);
    double best_error = INFINITY;
    float beta = options.beta;
    for (int it = 0; it < options.iterations; ++it) {
      double error = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : error) if (groups >= kParallelGroups)
      for (int64_t g = 0; g < groups; ++g)
        error += hqq_step(w + g * kHqqGroupSize, inv_scale[g], zero[g], beta, options.lp_norm,
                          &next_zero[g]);
      if (options.global_sum) error = options.global_sum(error);
      if (!(error < best_error)) break;  // this iteration's zero is no better: keep the best
      best_error = error;
      std::copy(zero, zero + groups, best_zero.begin());
      std::copy(next_zero.begin(), next_zero.end(), zero);
      beta *= options.kappa;
    }
    std::copy(best_zero.begin(), best_zero.end(), zero);
  }

  uint8_t* codes = q.codes.data<uint8_t>();
  float* scales = q.scales.data<float>();
#pragma omp parallel for schedule(static) if (groups >= kParallelGroups)
  for (int64_t g = 0; g < groups; ++g) {
    const float* x = w + g * kHqqGroupSize;
    uint8_t* out = codes + g * kHqqGroupSize / 2;
    for (int64_t i = 0; i < kHqqGroupSize; i += 2) {
      const auto hi = static_cast<uint8_t>(quantize_one(x[i], inv_scale[g], zero[g]));
      const auto lo = static_cast<uint8_t>(quantize_one(x[i + 1], inv_scale[g], zero[g]));
      out[i / 2] = static_cast<uint8_t>(hi << 4 | lo);
    }
    scales[g] = 1.0f / inv_scale[g];
  }
  return q;
}

void hqq_dequantize(const HqqWeight& q, float* out) {
  cpu::hqq_dequantize(out, q.codes.data<uint8_t>(), q.scales.data<float>(),
                      q.zeros.data<float>(), q.numel());
}

Tensor hqq_dequantize(const HqqWeight& q) {
  Tensor out = Tensor::empty(q.shape, DType::f32);
  hqq_dequantize(q, out.data<float>());
  return out;
}

}  // namespace frugal
