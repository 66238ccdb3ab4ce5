// AdamW exactly as torch.optim.AdamW computes it (single-tensor path), and the sum of squares
// for global-norm gradient clipping.
#include "kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace frugal::cpu {

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWStep& s, uint16_t* param_bf16) {
  FRUGAL_CHECK(s.step >= 1, "adamw step is 1-based, got ", s.step);
  // The scalars are computed in double, as Python does in torch's _single_tensor_adamw, then
  // enter the fp32 element math as floats.
  const double lr = s.lr, b1 = s.beta1, b2 = s.beta2;
  const double bias_correction1 = 1.0 - std::pow(b1, static_cast<double>(s.step));
  const double bias_correction2 = 1.0 - std::pow(b2, static_cast<double>(s.step));
  const float decay = static_cast<float>(1.0 - lr * static_cast<double>(s.weight_decay));
  const float one_minus_b1 = static_cast<float>(1.0 - b1);
  const float one_minus_b2 = static_cast<float>(1.0 - b2);
  const float beta2 = s.beta2;
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float eps = s.eps;
  const float grad_scale = s.grad_scale;

#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    float p = param[i] * decay;                  // param.mul_(1 - lr * wd)
    m[i] += one_minus_b1 * (g - m[i]);           // exp_avg.lerp_(grad, 1 - beta1)
    v[i] = v[i] * beta2 + one_minus_b2 * g * g;  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
    const float denom = std::sqrt(v[i]) / bias_correction2_sqrt + eps;
    p -= step_size * (m[i] / denom);  // param.addcdiv_(exp_avg, denom, -step_size)
    param[i] = p;
    if (param_bf16) param_bf16[i] = float_to_bf16(p);
  }
}

double sum_squares(const float* x, int64_t n) {
  // Fixed-size chunks summed in chunk order: the same result for any thread count.
  constexpr int64_t kChunk = 1 << 14;
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(n_chunks), 0.0);
#pragma omp parallel for schedule(static) if (n_chunks > 1)
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double acc = 0.0;
    for (int64_t i = c * kChunk; i < end; ++i) acc += static_cast<double>(x[i]) * x[i];
    partial[c] = acc;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace frugal::cpu
