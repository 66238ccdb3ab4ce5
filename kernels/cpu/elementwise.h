// Small elementwise helpers the model needs between the big kernels.
#pragma once
#include <cstdint>

namespace frugal::cpu {

void add_inplace(float* y, const float* x, int64_t n);                  // y += x
void scale_inplace(float* y, float s, int64_t n);                       // y *= s
void add_scaled_inplace(float* y, const float* x, float s, int64_t n);  // y += s * x

}  // namespace frugal::cpu
