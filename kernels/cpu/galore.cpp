// GaLore's elementwise steps on the host. The arithmetic is written out one rounding at a time
// (products, then sums; no fused multiply-add), as the CUDA twin computes it.
#include "kernels/cpu/galore.h"

#include <cmath>
#include <numbers>

#include "core/dtype.h"
#include "kernels/galore_sketch.h"

namespace frugal::cpu {

void galore_moments(float* m, float* v, float* r, int64_t n, float beta1, float beta2, float eps) {
  const float one_minus_b1 = static_cast<float>(1.0 - double(beta1));
  const float one_minus_b2 = static_cast<float>(1.0 - double(beta2));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = r[i];
    // exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1), and likewise exp_avg_sq with grad^2.
    const float mi = m[i] * beta1 + one_minus_b1 * g;
    const float vi = v[i] * beta2 + one_minus_b2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    r[i] = mi / (std::sqrt(vi) + eps);
  }
}

void galore_apply(float* param, const float* delta, int64_t n, float step, float decay,
                  uint16_t* param_bf16) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float stepped = param[i] + step * delta[i];
    const float p = stepped + decay * stepped;
    param[i] = p;
    if (param_bf16) param_bf16[i] = float_to_bf16(p);
  }
}

void galore_apply_bf16(uint16_t* param, const float* delta, int64_t n, float step, float decay,
                       const Bf16Store& store) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float stepped = bf16_to_float(param[i]) + step * delta[i];
    param[i] = bf16_store(stepped + decay * stepped, store, i);
  }
}

void galore_sketch(float* omega, int64_t count, uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    double u1, u2;
    galore_sketch_uniforms(seed, i, u1, u2);
    omega[i] =
        static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }
}

}  // namespace frugal::cpu
