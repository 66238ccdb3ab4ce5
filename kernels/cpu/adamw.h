// AdamW as torch.optim.AdamW defines it (decoupled weight decay, bias-corrected moments),
// and the pieces of global-norm gradient clipping.
#pragma once
#include <cstdint>

#include "kernels/stochastic_rounding.h"

namespace frugal::cpu {

struct AdamWStep {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0;
  int64_t step = 1;      // 1-based, for the bias corrections
  float grad_scale = 1;  // the gradient is multiplied by this first (clipping, averaging)
};

// What every element's update needs, folded on the host in double from AdamWStep, then used
// as floats (by this file's loop and by the CUDA kernel, which therefore round alike).
struct AdamWScalars {
  float decay;         // 1 - lr * wd
  float one_minus_b1;  // 1 - beta1
  float one_minus_b2;  // 1 - beta2
  float beta2;
  float step_size;  // lr / (1 - beta1^t)
  float bias_correction2_sqrt;
  float eps;
  float grad_scale;
};
AdamWScalars adamw_scalars(const AdamWStep& s);  // checks that s.step >= 1

// param -= lr * wd * param;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
// param -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// evaluated as torch's single-tensor path does: scalars (1 - lr wd, lr / (1 - b1^t),
// sqrt(1 - b2^t)) in double, then per element in fp32 m += (1-b1)(g - m) (lerp),
// denom = sqrt(v) / sqrt(1 - b2^t) + eps, param -= step_size * (m / denom).
// param_bf16 (optional): also writes each updated weight rounded to bf16 (nearest even), in
// the same pass: the copy an offloaded GPU run uploads, without a second pass over param.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWStep& s, uint16_t* param_bf16 = nullptr);

// A bf16 master (optim.master_dtype = bf16): param and grad bf16 (raw bits), the moments fp32
// or bf16 (these rounded to nearest even). The element math is adamw_update's on the widened
// values, and each updated weight is stored as `store` says: stochastically (the default) or
// to nearest even.
void adamw_update_bf16(uint16_t* param, const uint16_t* grad, float* m, float* v, int64_t n,
                       const AdamWStep& s, const Bf16Store& store);
void adamw_update_bf16(uint16_t* param, const uint16_t* grad, uint16_t* m, uint16_t* v, int64_t n,
                       const AdamWStep& s, const Bf16Store& store);

// sum of x[i]^2 in fp64 (for the global gradient norm)
double sum_squares(const float* x, int64_t n);

// The health monitor's pass over a gradient: the same sum of squares, bit for bit (a NaN or an
// inf makes it NaN or inf, as it does the norm), and how many values are not finite, and how
// many finite ones a cast to bf16 (round to nearest even) would turn into zero or a subnormal
// (underflow: lost where subnormals are flushed) or into inf (overflow).
struct GradHealthCounts {
  double sum_squares = 0;
  int64_t nonfinite = 0;
  int64_t bf16_underflow = 0;
  int64_t bf16_overflow = 0;
};
GradHealthCounts grad_health(const float* x, int64_t n);

}  // namespace frugal::cpu
