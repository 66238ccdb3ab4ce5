// Rotary position embedding on the GPU in Hugging Face's rotate-half convention: for head-dim d,
// pair element i with i + d/2, angle = pos * inv_freq[i]; bf16 tensors, fp32 math.
//
// The frequency table (d/2 floats, at most 1 KiB) travels by value in the kernel's arguments:
// no device buffer to keep in step with the config, no copy on the stream. One block per
// token. Its threads first compute the token's d/2 cos/sin values into shared memory, with the
// same roundings as the CPU kernel (cos/sin evaluated in double and rounded to float, the angle
// a float product, the attention scaling a float product), so both backends rotate by the same
// float cos/sin; double math is slow on consumer GPUs, but it is d/2 values per token shared by
// all heads, negligible next to the loads. Then the threads rotate every (head, pair) of the token:
// with head_dim a multiple of 16 and x, y 16-byte aligned, 8 pairs per thread through two 16-byte
// loads (elements i..i+7 and i+d/2..i+d/2+7); otherwise one pair at a time. The result goes to
// y, which may be x: out of place, the rotation reads and writes each element once, where a copy
// and an in-place rotation would move it twice.
#include <algorithm>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pack16.cuh"
#include "kernels/cuda/rope.h"

namespace frugal::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kMaxThreads = 256;

struct RopeTable {
  float inv_freq[kMaxRopePairs];
};

// sign = +1 rotates forward, -1 backward. cos_sin: 2 * half floats of dynamic shared memory.
template <int W>
__global__ void rope_kernel(bf16* y, const bf16* x, const int32_t* positions, int64_t heads,
                            int64_t head_dim, const RopeTable table, float scaling, float sign) {
  extern __shared__ float cos_sin[];
  const int64_t half = head_dim / 2;
  float* cos_t = cos_sin;
  float* sin_t = cos_sin + half;
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * table.inv_freq[i];
    cos_t[i] = __fmul_rn(static_cast<float>(cos(static_cast<double>(angle))), scaling);
    sin_t[i] = sign * __fmul_rn(static_cast<float>(sin(static_cast<double>(angle))), scaling);
  }
  __syncthreads();

  const int64_t groups_per_head = half / W;
  const bf16* xt = x + t * heads * head_dim;
  bf16* yt = y + t * heads * head_dim;
  for (int64_t q = threadIdx.x; q < heads * groups_per_head; q += blockDim.x) {
    const int64_t h = q / groups_per_head;
    const int64_t i = (q % groups_per_head) * W;
    const bf16* xh = xt + h * head_dim;
    bf16* yh = yt + h * head_dim;
    float x1[W], x2[W], y1[W], y2[W];
    load_n<W>(x1, xh + i);
    load_n<W>(x2, xh + i + half);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float c = cos_t[i + k], s = sin_t[i + k];
      y1[k] = x1[k] * c - x2[k] * s;
      y2[k] = x2[k] * c + x1[k] * s;
    }
    store_n<W>(yh + i, y1);
    store_n<W>(yh + i + half, y2);
  }
}

void launch_rope(const char* what, bf16* y, const bf16* x, const int32_t* positions, int64_t tokens,
                 int64_t heads, int64_t head_dim, const float* inv_freq, float scaling, float sign,
                 cudaStream_t stream) {
  FRUGAL_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim / 2 <= kMaxRopePairs, what,
               " needs an even head_dim of at most ", 2 * kMaxRopePairs, ", got ", head_dim);
  RopeTable table{};
  std::copy(inv_freq, inv_freq + head_dim / 2, table.inv_freq);
  FRUGAL_CHECK(tokens >= 0 && tokens <= INT32_MAX && heads > 0, what, ": tokens ", tokens,
               ", heads ", heads);
  if (tokens == 0) return;
  const int64_t half = head_dim / 2;
  const size_t shared_bytes = 2 * sizeof(float) * static_cast<size_t>(half);
  const bool vec = half % kGroup == 0 && aligned16(x) && aligned16(y);
  const int64_t items = heads * (vec ? half / kGroup : half);
  const int threads = static_cast<int>(
      std::clamp<int64_t>((items + kWarpSize - 1) / kWarpSize * kWarpSize, kWarpSize, kMaxThreads));
  const unsigned blocks = static_cast<unsigned>(tokens);
  if (vec)
    rope_kernel<kGroup><<<blocks, threads, shared_bytes, stream>>>(y, x, positions, heads, head_dim,
                                                                   table, scaling, sign);
  else
    rope_kernel<1><<<blocks, threads, shared_bytes, stream>>>(y, x, positions, heads, head_dim,
                                                              table, scaling, sign);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(bf16* y, const bf16* x, const int32_t* positions, int64_t tokens, int64_t heads,
                  int64_t head_dim, const float* inv_freq, float attention_scaling,
                  cudaStream_t stream) {
  launch_rope("rope_forward", y, x, positions, tokens, heads, head_dim, inv_freq, attention_scaling,
              1.0f, stream);
}

void rope_backward(bf16* dx, const bf16* dy, const int32_t* positions, int64_t tokens,
                   int64_t heads, int64_t head_dim, const float* inv_freq, float attention_scaling,
                   cudaStream_t stream) {
  launch_rope("rope_backward", dx, dy, positions, tokens, heads, head_dim, inv_freq,
              attention_scaling, -1.0f, stream);
}

}  // namespace frugal::cuda
