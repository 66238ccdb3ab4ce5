// GaLore's two elementwise steps on the GPU, the twins of kernels/cpu/galore.h: Adam's moments
// on the projected gradient, and the weight update from the projected-back step.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/stochastic_rounding.h"

namespace frugal::cuda {

// m = beta1 m + (1 - beta1) r;  v = beta2 v + (1 - beta2) r^2;  r = m / (sqrt(v) + eps)
void galore_moments(float* m, float* v, float* r, int64_t n, float beta1, float beta2, float eps,
                    cudaStream_t stream);

// param = p + decay * p with p = param + step * delta; param_bf16 (may be null) receives bf16(p).
// A bf16 param (a bf16 master) is widened, updated in fp32 and stored once as `store` says
// (stochastically or to nearest even: kernels/stochastic_rounding.h, the CPU twin's bits).
void galore_apply(float* param, const float* delta, int64_t n, float step, float decay,
                  __nv_bfloat16* param_bf16, cudaStream_t stream);
void galore_apply(__nv_bfloat16* param, const float* delta, int64_t n, float step, float decay,
                  const Bf16Store& store, cudaStream_t stream);

// The randomized projector's sketch Omega (count entries): kernels/cpu/galore.h's galore_sketch,
// drawn on the device (the float64 log and cos of CUDA's math library agree with the host's
// to an ulp or so, so an entry may differ from the CPU twin's in its last fp32 bit).
void galore_sketch(float* omega, int64_t count, uint64_t seed, cudaStream_t stream);

}  // namespace frugal::cuda
