// One warp per (sequence, head, query row): the lanes share the row's D columns.
#include "kernels/cuda/attention_merge.h"

#include <cmath>

#include "kernels/cuda/cuda_check.h"

namespace frugal::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void merge_kernel(float* out, float* lse, const __nv_bfloat16* part_out,
                             const float* part_lse, int64_t batch, int64_t T, int64_t H,
                             int64_t D) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;  // lse order
  if (row >= batch * H * T) return;
  const int lane = threadIdx.x % 32;
  const int64_t b = row / (H * T), h = (row / T) % H, i = row % T;
  const float lse_new = part_lse[row];
  if (lse_new == -INFINITY) return;
  const float lse_old = lse[row];
  float* o = out + ((b * T + i) * H + h) * D;
  const __nv_bfloat16* p = part_out + ((b * T + i) * H + h) * D;
  float w_old = 0.0f, w_new = 1.0f, lse_sum = lse_new;
  if (lse_old != -INFINITY) {
    // The CPU twin's arithmetic, in the same order.
    const float m = fmaxf(lse_old, lse_new);
    lse_sum = m + logf(expf(lse_old - m) + expf(lse_new - m));
    w_old = expf(lse_old - lse_sum);
    w_new = expf(lse_new - lse_sum);
  }
  for (int64_t d = lane; d < D; d += 32)
    o[d] = lse_old == -INFINITY ? __bfloat162float(p[d]) : w_old * o[d] + w_new * __bfloat162float(p[d]);
  __syncwarp();  // every lane has read lse_old
  if (lane == 0) lse[row] = lse_sum;
}

}  // namespace

void merge_attention(float* out, float* lse, const __nv_bfloat16* part_out, const float* part_lse,
                     int64_t batch, int64_t T, int64_t H, int64_t D, cudaStream_t stream) {
  const int64_t rows = batch * H * T;
  if (rows == 0) return;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  merge_kernel<<<unsigned(blocks), kWarpsPerBlock * 32, 0, stream>>>(out, lse, part_out, part_lse,
                                                                     batch, T, H, D);
  CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::cuda
