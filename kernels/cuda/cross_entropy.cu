// Cross-entropy over a chunk of logit rows on the GPU: one block per row finds the max and the
// sum of exponentials in a single online-softmax pass, then writes the loss and the gradient.
//
// Every thread keeps a running (max, sum of exp(x - max)) over its strided columns; the pairs
// are merged with a fixed shuffle tree and then warp by warp in order, so the result does not
// depend on timing. The per-row losses are summed by one block in a fixed order.
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"

namespace frugal::cuda {

namespace {

constexpr int kRowThreads = 256;  // threads per row (cross_entropy_kernel)
constexpr int kSumThreads = 256;  // threads of the single block that sums the row losses

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Merges the running softmax state (max_b, sum_b) into (max_a, sum_a).
__device__ __forceinline__ void merge_softmax(float& max_a, float& sum_a, float max_b,
                                              float sum_b) {
  const float new_max = fmaxf(max_a, max_b);
  if (new_max == -INFINITY) return;  // both empty
  sum_a = sum_a * expf(max_a - new_max) + sum_b * expf(max_b - new_max);
  max_a = new_max;
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_kernel(float* row_loss, __nv_bfloat16* dlogits, const T* logits,
                         const int32_t* targets, int64_t vocab, float grad_scale,
                         int32_t* error_info) {
  __shared__ float warp_max[kRowThreads / 32], warp_sum[kRowThreads / 32];
  __shared__ float row_lse;
  const int64_t r = blockIdx.x;
  const T* x = logits + r * vocab;
  __nv_bfloat16* dx = dlogits != nullptr ? dlogits + r * vocab : nullptr;
  const int32_t target = targets[r];
  const bool out_of_range = target >= vocab;
  if (target < 0 || out_of_range) {
    // Masked (or invalid, reported below) rows count nothing and have no gradient.
    if (dx != nullptr)
      for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) dx[c] = __float2bfloat16(0.0f);
    if (threadIdx.x == 0) {
      row_loss[r] = 0.0f;
      if (out_of_range && atomicCAS(error_info, 0, static_cast<int32_t>(r) + 1) == 0)
        error_info[1] = target;
    }
    return;
  }

  float max = -INFINITY, sum = 0.0f;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float value = to_float(x[c]);
    if (value > max) {
      sum = sum * expf(max - value) + 1.0f;
      max = value;
    } else {
      sum += expf(value - max);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_max = __shfl_xor_sync(0xffffffffu, max, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, sum, offset);
    merge_softmax(max, sum, other_max, other_sum);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_max[warp] = max;
    warp_sum[warp] = sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float block_max = warp_max[0], block_sum = warp_sum[0];
    for (int w = 1; w < kRowThreads / 32; ++w)
      merge_softmax(block_max, block_sum, warp_max[w], warp_sum[w]);
    row_lse = block_max + logf(block_sum);
    row_loss[r] = row_lse - to_float(x[target]);
  }
  __syncthreads();
  if (dx == nullptr) return;
  const float lse = row_lse;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float p = expf(to_float(x[c]) - lse);
    dx[c] = __float2bfloat16(grad_scale * (c == target ? p - 1.0f : p));
  }
}

// *loss_sum += sum of row_loss[0, rows), in a fixed order: strided per thread, then a tree.
__global__ void __launch_bounds__(kSumThreads)
    sum_rows_kernel(float* loss_sum, const float* row_loss, int64_t rows) {
  __shared__ float partial[kSumThreads];
  float sum = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += kSumThreads) sum += row_loss[r];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kSumThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss_sum += partial[0];
}

template <typename T>
void cross_entropy_for(float* loss_sum, float* row_loss, __nv_bfloat16* dlogits, const T* logits,
                       const int32_t* targets, int64_t rows, int64_t vocab, float grad_scale,
                       int32_t* error_info, cudaStream_t stream, bool check) {
  FRUGAL_CHECK(rows >= 0 && vocab > 0, "cross_entropy rows ", rows, " vocab ", vocab);
  FRUGAL_CHECK(rows <= INT32_MAX - 1, "cross_entropy: too many rows in one chunk: ", rows);
  if (rows == 0) return;
  cross_entropy_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      row_loss, dlogits, logits, targets, vocab, grad_scale, error_info);
  CUDA_CHECK_LAUNCH();
  sum_rows_kernel<<<1, kSumThreads, 0, stream>>>(loss_sum, row_loss, rows);
  CUDA_CHECK_LAUNCH();
  if (check) cross_entropy_check(error_info, vocab, stream);
}

}  // namespace

void cross_entropy(float* loss_sum, float* row_loss, __nv_bfloat16* dlogits,
                   const __nv_bfloat16* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                   float grad_scale, int32_t* error_info, cudaStream_t stream, bool check) {
  cross_entropy_for(loss_sum, row_loss, dlogits, logits, targets, rows, vocab, grad_scale,
                    error_info, stream, check);
}

void cross_entropy(float* loss_sum, float* row_loss, __nv_bfloat16* dlogits, const float* logits,
                   const int32_t* targets, int64_t rows, int64_t vocab, float grad_scale,
                   int32_t* error_info, cudaStream_t stream, bool check) {
  cross_entropy_for(loss_sum, row_loss, dlogits, logits, targets, rows, vocab, grad_scale,
                    error_info, stream, check);
}

void cross_entropy_check(int32_t* error_info, int64_t vocab, cudaStream_t stream) {
  int32_t info[2] = {0, 0};
  CUDA_CHECK(cudaMemcpyAsync(info, error_info, sizeof(info), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (info[0] == 0) return;
  CUDA_CHECK(cudaMemsetAsync(error_info, 0, sizeof(info), stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  fail("cross_entropy: target id ", info[1], " at row ", info[0] - 1,
       " is outside the vocabulary [0, ", vocab, ")");
}

}  // namespace frugal::cuda
