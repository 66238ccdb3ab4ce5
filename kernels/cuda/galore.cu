// GaLore's elementwise steps on the GPU: grid-stride loops, one element per thread per
// iteration (both are memory-bound and far cheaper than the projections' GEMMs). The math is
// the CPU twin's, rounded the same way (__fmul_rn / __fadd_rn keep the compiler from fusing a
// multiply-add), so fp32 results match kernels/cpu/galore.cpp bit for bit.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/galore.h"
#include "kernels/cuda/pack16.cuh"
#include "kernels/galore_sketch.h"

namespace frugal::cuda {

namespace {

constexpr int kThreads = 256;
constexpr double kPi = 3.141592653589793;  // std::numbers::pi

__global__ void galore_moments_kernel(float* m, float* v, float* r, int64_t n, float beta1,
                                      float beta2, float one_minus_b1, float one_minus_b2,
                                      float eps) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float g = r[i];
    const float mi = __fadd_rn(__fmul_rn(m[i], beta1), __fmul_rn(one_minus_b1, g));
    const float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(one_minus_b2, __fmul_rn(g, g)));
    m[i] = mi;
    v[i] = vi;
    r[i] = __fdiv_rn(mi, __fadd_rn(__fsqrt_rn(vi), eps));
  }
}

__global__ void galore_apply_kernel(float* param, const float* delta, int64_t n, float step,
                                    float decay, __nv_bfloat16* param_bf16) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float stepped = __fadd_rn(param[i], __fmul_rn(step, delta[i]));
    const float p = __fadd_rn(stepped, __fmul_rn(decay, stepped));
    param[i] = p;
    if (param_bf16) param_bf16[i] = __float2bfloat16_rn(p);
  }
}

__global__ void galore_apply_bf16_kernel(__nv_bfloat16* param, const float* delta, int64_t n,
                                         float step, float decay, const Bf16Store store) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float stepped = __fadd_rn(__bfloat162float(param[i]), __fmul_rn(step, delta[i]));
    param[i] =
        __ushort_as_bfloat16(bf16_store(__fadd_rn(stepped, __fmul_rn(decay, stepped)), store, i));
  }
}

// One entry per thread per iteration: Box-Muller in float64 (H100/H200 run fp64 at half the
// fp32 rate, and 1M entries take microseconds), so the host's definition holds to rounding.
__global__ void galore_sketch_kernel(float* omega, int64_t count, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    double u1, u2;
    galore_sketch_uniforms(seed, i, u1, u2);
    // The host's argument, 2 pi rounded to double and then times u2.
    omega[i] = static_cast<float>(sqrt(-2.0 * log(u1)) * cos(2.0 * kPi * u2));
  }
}

}  // namespace

void galore_moments(float* m, float* v, float* r, int64_t n, float beta1, float beta2, float eps,
                    cudaStream_t stream) {
  if (n <= 0) return;
  const float one_minus_b1 = static_cast<float>(1.0 - double(beta1));
  const float one_minus_b2 = static_cast<float>(1.0 - double(beta2));
  galore_moments_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(
      m, v, r, n, beta1, beta2, one_minus_b1, one_minus_b2, eps);
  CUDA_CHECK_LAUNCH();
}

void galore_apply(float* param, const float* delta, int64_t n, float step, float decay,
                  __nv_bfloat16* param_bf16, cudaStream_t stream) {
  if (n <= 0) return;
  galore_apply_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(
      param, delta, n, step, decay, param_bf16);
  CUDA_CHECK_LAUNCH();
}

void galore_apply(__nv_bfloat16* param, const float* delta, int64_t n, float step, float decay,
                  const Bf16Store& store, cudaStream_t stream) {
  if (n <= 0) return;
  galore_apply_bf16_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(
      param, delta, n, step, decay, store);
  CUDA_CHECK_LAUNCH();
}

void galore_sketch(float* omega, int64_t count, uint64_t seed, cudaStream_t stream) {
  if (count <= 0) return;
  galore_sketch_kernel<<<grid_stride_blocks(count, kThreads), kThreads, 0, stream>>>(omega, count,
                                                                                     seed);
  CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::cuda
