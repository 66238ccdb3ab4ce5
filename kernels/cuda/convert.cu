// bf16 <-> fp32 conversion on the GPU: master weights (fp32) to the bf16 copies the forward
// reads, and bf16 tensors widened for fp32 accumulation.
//
// One grid-stride kernel per direction. Where both pointers are 16-byte aligned the body moves
// 8 elements per thread and iteration (one 16-byte bf16 access, two 16-byte fp32 ones); the
// last n % 8 elements, or all of them when a pointer is misaligned, go one at a time.
#include "kernels/cuda/convert.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pack16.cuh"

namespace frugal::cuda {

namespace {

constexpr int kThreads = 256;

template <class Out, class In, bool kVec>
__global__ void convert_kernel(Out* out, const In* in, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_groups = kVec ? n / kGroup : 0;
  for (int64_t g = first; g < n_groups; g += stride) {
    float x[kGroup];
    load_group(x, in + g * kGroup);
    store_group(out + g * kGroup, x);
  }
  for (int64_t i = n_groups * kGroup + first; i < n; i += stride)
    out[i] = from_float<Out>(to_float(in[i]));
}

template <class Out, class In>
void launch_convert(Out* out, const In* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (all_aligned16(out, in)) {
    const unsigned blocks = grid_stride_blocks((n + kGroup - 1) / kGroup, kThreads);
    convert_kernel<Out, In, true><<<blocks, kThreads, 0, stream>>>(out, in, n);
  } else {
    const unsigned blocks = grid_stride_blocks(n, kThreads);
    convert_kernel<Out, In, false><<<blocks, kThreads, 0, stream>>>(out, in, n);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void bf16_to_f32(float* out, const __nv_bfloat16* in, int64_t n, cudaStream_t stream) {
  launch_convert(out, in, n, stream);
}

void f32_to_bf16(__nv_bfloat16* out, const float* in, int64_t n, cudaStream_t stream) {
  launch_convert(out, in, n, stream);
}

}  // namespace frugal::cuda
