// GaLore's two elementwise steps (Zhao et al. 2024, galore-torch's GaLoreAdamW): Adam's moments
// on a projected gradient, and the weight update from the projected-back step.
#pragma once
#include <cstdint>

#include "kernels/stochastic_rounding.h"

namespace frugal::cpu {

// On the low-rank gradient r (n values), as GaLoreAdamW does it:
//   m = beta1 m + (1 - beta1) r;  v = beta2 v + (1 - beta2) r^2;  r = m / (sqrt(v) + eps)
// r is overwritten by the normalized step (eps outside the bias correction: the reference's).
void galore_moments(float* m, float* v, float* r, int64_t n, float beta1, float beta2, float eps);

// param = p + decay * p with p = param + step * delta (n values): the reference's order, the
// step first, then decoupled weight decay of the updated weight (decay = -lr * weight_decay).
// param_bf16, when not null, receives the result rounded to bf16 (nearest even).
void galore_apply(float* param, const float* delta, int64_t n, float step, float decay,
                  uint16_t* param_bf16);

// The same update of a bf16 master (raw bits): the arithmetic on the widened weight, each
// result stored as `store` says (stochastically, or to nearest even).
void galore_apply_bf16(uint16_t* param, const float* delta, int64_t n, float step, float decay,
                       const Bf16Store& store);

// The randomized projector's sketch Omega (count entries, row-major [n, l]): entry i is
// sqrt(-2 log u1) cos(2 pi u2) in float64 with kernels/galore_sketch.h's uniforms, rounded
// to fp32 once.
void galore_sketch(float* omega, int64_t count, uint64_t seed);

}  // namespace frugal::cpu
