// Small elementwise helpers the model needs between the big kernels.
#include "kernels/cpu/elementwise.h"

namespace frugal::cpu {

// Below this many elements a thread team costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 15;

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float s, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

void add_scaled_inplace(float* y, const float* x, float s, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) y[i] += s * x[i];
}

}  // namespace frugal::cpu
