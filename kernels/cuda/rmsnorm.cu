// RMSNorm on the GPU as Llama uses it: y = x / sqrt(mean(x^2) + eps) * w; bf16 activations and
// weights, fp32 statistics and math, fp32 weight gradient.
//
// Forward: one block per row. Pass 1 sums x^2 (warp shuffles, then across warps), pass 2
// rereads the row (from L1/L2: a row is at most a few tens of KiB) and writes y. The fused
// variant adds the residual in pass 1, rounds the sum to bf16, writes it, and normalizes that
// rounded value, so forward and backward see the same s.
// Backward: dx per row as on the CPU, dx = rstd dy w - rstd^3 x / dim * sum(dy w x). dw is a sum
// over all rows; to keep it deterministic without float atomics, a fixed number of blocks
// (depending only on `rows`) each own the rows b, b + grid, ... and accumulate their dw
// contribution in shared memory (each thread owns fixed columns, so no races); each block
// writes its partial row to dw_scratch, and a second kernel sums the partials per column in a
// fixed order and adds the result to dw: each of its blocks owns 32 columns, its warps the
// partial rows w, w + 8, ... (coalesced 128-byte reads), summed in shared memory in warp order.
// (One thread per column reading all partials in turn, as before, left the GPU nearly empty:
// 32 us a call at dim 2048 on an H200, against the backward kernel's own 40; now 4 us.)
// Rows whose length is a multiple of 8, with 16-byte aligned tensors, move 8 bf16 per load.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pack16.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace frugal::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kMaxRowThreads = 512;
// Blocks (hence dw partial rows) of the backward when dw is wanted: enough to fill the GPU a few
// times over, few enough that the second pass over the partials is cheap.
constexpr int64_t kDwBlocks = 512;
constexpr int kReduceWarps = 8;
constexpr int kReduceThreads = kReduceWarps * kWarpSize;
constexpr size_t kDefaultSharedBytes = 48 * 1024;  // usable without opting in, static included
constexpr size_t kStaticSharedMargin = 1024;

// Threads for one row of `dim` elements taken W at a time: one W-group per thread up to
// kMaxRowThreads, a whole number of warps.
int row_threads(int64_t dim, int w) {
  const int64_t groups = (dim + w - 1) / w;
  const int64_t warps = (groups + kWarpSize - 1) / kWarpSize;
  return static_cast<int>(std::clamp<int64_t>(warps * kWarpSize, kWarpSize, kMaxRowThreads));
}

template <int W, bool kResidual>
__global__ void rmsnorm_forward_kernel(bf16* s, bf16* y, float* rstd, const bf16* x, const bf16* r,
                                       const bf16* w, int64_t dim, float eps) {
  __shared__ float scratch[kWarpSize];
  const int64_t row = blockIdx.x;
  const bf16* xr = x + row * dim;
  bf16* yr = y + row * dim;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * W;
  const int64_t step = static_cast<int64_t>(blockDim.x) * W;

  float sum_sq = 0.0f;
  for (int64_t j = first; j < dim; j += step) {
    float v[W];
    load_n<W>(v, xr + j);
    if constexpr (kResidual) {
      float rv[W];
      load_n<W>(rv, r + row * dim + j);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = __bfloat162float(__float2bfloat16_rn(v[k] + rv[k]));
      store_n<W>(s + row * dim + j, v);
    }
#pragma unroll
    for (int k = 0; k < W; ++k) sum_sq += v[k] * v[k];
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float rs = 1.0f / sqrtf(sum_sq / static_cast<float>(dim) + eps);

  // For the fused variant this rereads this thread's own writes of s: same thread, same
  // addresses, so they are visible without a barrier.
  const bf16* src = kResidual ? s + row * dim : xr;
  for (int64_t j = first; j < dim; j += step) {
    float v[W], wv[W];
    load_n<W>(v, src + j);
    load_n<W>(wv, w + j);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = v[k] * rs * wv[k];
    store_n<W>(yr + j, v);
  }
  if (rstd != nullptr && threadIdx.x == 0) rstd[row] = rs;
}

// kDw: accumulate this block's dw contribution in shared memory (dim floats) and write it to
// dw_partial[blockIdx.x, :].
template <int W, bool kDw>
__global__ void rmsnorm_backward_kernel(bf16* dx, float* dw_partial, const bf16* dy, const bf16* x,
                                        const bf16* w, const float* rstd, const bf16* dresidual,
                                        int64_t rows, int64_t dim) {
  extern __shared__ float dw_acc[];
  __shared__ float scratch[kWarpSize];
  const int64_t first = static_cast<int64_t>(threadIdx.x) * W;
  const int64_t step = static_cast<int64_t>(blockDim.x) * W;
  // Each thread zeroes, accumulates and writes out the same columns: no barrier needed.
  if constexpr (kDw)
    for (int64_t j = first; j < dim; j += step)
#pragma unroll
      for (int k = 0; k < W; ++k) dw_acc[j + k] = 0.0f;

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const bf16* xr = x + row * dim;
    const bf16* dyr = dy + row * dim;
    const float rs = rstd[row];
    float dot = 0.0f;
    for (int64_t j = first; j < dim; j += step) {
      float xv[W], dyv[W], wv[W];
      load_n<W>(xv, xr + j);
      load_n<W>(dyv, dyr + j);
      load_n<W>(wv, w + j);
#pragma unroll
      for (int k = 0; k < W; ++k) dot += dyv[k] * wv[k] * xv[k];
    }
    dot = block_sum(dot, scratch);
    const float coef = rs * rs * rs * dot / static_cast<float>(dim);

    for (int64_t j = first; j < dim; j += step) {
      float xv[W], dyv[W], wv[W], dxv[W], dres[W] = {};
      load_n<W>(xv, xr + j);
      load_n<W>(dyv, dyr + j);
      load_n<W>(wv, w + j);
      if (dresidual != nullptr) load_n<W>(dres, dresidual + row * dim + j);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        dxv[k] = rs * dyv[k] * wv[k] - coef * xv[k] + dres[k];
        if constexpr (kDw) dw_acc[j + k] += dyv[k] * xv[k] * rs;
      }
      store_n<W>(dx + row * dim + j, dxv);
    }
  }

  if constexpr (kDw)
    for (int64_t j = first; j < dim; j += step)
#pragma unroll
      for (int k = 0; k < W; ++k) dw_partial[blockIdx.x * dim + j + k] = dw_acc[j + k];
}

// dw[j] += sum over b of partial[b, j] (without accumulate, dw[j] = the sum): block x owns
// columns 32x .. 32x + 31, lane l column 32x + l; warp w sums rows w, w + kReduceWarps, ... in
// order, then warp 0 adds the warps' sums in warp order. The same order on every run: bitwise
// reproducible. A bf16 dw is rounded once, after the add in fp32.
template <class DwT>
__global__ void rmsnorm_dw_reduce_kernel(DwT* dw, const float* partial, int64_t n_partials,
                                         int64_t dim, bool accumulate) {
  __shared__ float warp_sums[kReduceWarps][kWarpSize];
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarpSize + lane;
  float acc = 0.0f;
  if (j < dim)
    for (int64_t b = warp; b < n_partials; b += kReduceWarps) acc += partial[b * dim + j];
  warp_sums[warp][lane] = acc;
  __syncthreads();
  if (warp != 0 || j >= dim) return;
  float total = warp_sums[0][lane];
  for (int k = 1; k < kReduceWarps; ++k) total += warp_sums[k][lane];
  if constexpr (std::is_same_v<DwT, float>)
    dw[j] = accumulate ? dw[j] + total : total;
  else
    dw[j] = __float2bfloat16(accumulate ? __bfloat162float(dw[j]) + total : total);
}

bool use_vectors(int64_t dim, const void* a, const void* b, const void* c, const void* d,
                 const void* e) {
  return dim % kGroup == 0 && all_aligned16(a, b, c, d, e);
}

template <int W, bool kResidual>
void launch_forward(bf16* s, bf16* y, float* rstd, const bf16* x, const bf16* r, const bf16* w,
                    int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  rmsnorm_forward_kernel<W, kResidual>
      <<<static_cast<unsigned>(rows), row_threads(dim, W), 0, stream>>>(s, y, rstd, x, r, w, dim,
                                                                        eps);
  CUDA_CHECK_LAUNCH();
}

void check_shape(const char* what, int64_t rows, int64_t dim) {
  FRUGAL_CHECK(rows >= 0 && rows <= INT32_MAX && dim > 0, what, ": rows ", rows, ", dim ", dim);
}

template <int W, class DwT>
void launch_backward(bf16* dx, DwT* dw, const bf16* dy, const bf16* x, const bf16* w,
                     const float* rstd, const bf16* dresidual, int64_t rows, int64_t dim,
                     float* dw_scratch, cudaStream_t stream, bool accumulate) {
  const int threads = row_threads(dim, W);
  if (dw == nullptr) {
    rmsnorm_backward_kernel<W, false><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        dx, nullptr, dy, x, w, rstd, dresidual, rows, dim);
    CUDA_CHECK_LAUNCH();
    return;
  }
  FRUGAL_CHECK(dw_scratch != nullptr, "rmsnorm_backward: dw wanted but dw_scratch is null");
  const int64_t blocks = std::min(rows, kDwBlocks);
  const size_t shared_bytes = sizeof(float) * static_cast<size_t>(dim);
  // The default limit counts static shared memory too (the block_sum scratch): keep a margin.
  if (shared_bytes + kStaticSharedMargin > kDefaultSharedBytes) {
    CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_backward_kernel<W, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared_bytes)));
  }
  rmsnorm_backward_kernel<W, true>
      <<<static_cast<unsigned>(blocks), threads, shared_bytes, stream>>>(
          dx, dw_scratch, dy, x, w, rstd, dresidual, rows, dim);
  CUDA_CHECK_LAUNCH();
  const auto reduce_blocks = static_cast<unsigned>((dim + kWarpSize - 1) / kWarpSize);
  rmsnorm_dw_reduce_kernel<DwT>
      <<<reduce_blocks, kReduceThreads, 0, stream>>>(dw, dw_scratch, blocks, dim, accumulate);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_forward(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t rows, int64_t dim,
                     float eps, cudaStream_t stream) {
  check_shape("rmsnorm_forward", rows, dim);
  if (rows == 0) return;
  if (use_vectors(dim, y, x, w, nullptr, nullptr))
    launch_forward<kGroup, false>(nullptr, y, rstd, x, nullptr, w, rows, dim, eps, stream);
  else
    launch_forward<1, false>(nullptr, y, rstd, x, nullptr, w, rows, dim, eps, stream);
}

void rmsnorm_residual_forward(bf16* s, bf16* y, float* rstd, const bf16* x, const bf16* r,
                              const bf16* w, int64_t rows, int64_t dim, float eps,
                              cudaStream_t stream) {
  check_shape("rmsnorm_residual_forward", rows, dim);
  if (rows == 0) return;
  if (use_vectors(dim, s, y, x, r, w))
    launch_forward<kGroup, true>(s, y, rstd, x, r, w, rows, dim, eps, stream);
  else
    launch_forward<1, true>(s, y, rstd, x, r, w, rows, dim, eps, stream);
}

int64_t rmsnorm_backward_scratch_floats(int64_t rows, int64_t dim) {
  return std::min(rows, kDwBlocks) * dim;
}

namespace {

template <class DwT>
void backward(bf16* dx, DwT* dw, const bf16* dy, const bf16* x, const bf16* w, const float* rstd,
              const bf16* dresidual, int64_t rows, int64_t dim, float* dw_scratch,
              cudaStream_t stream, bool accumulate) {
  check_shape("rmsnorm_backward", rows, dim);
  if (rows == 0) {  // nothing to add, or an overwritten dw of zeros
    if (dw != nullptr && !accumulate)
      CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(DwT) * static_cast<size_t>(dim), stream));
    return;
  }
  if (use_vectors(dim, dx, dy, x, w, dresidual))
    launch_backward<kGroup>(dx, dw, dy, x, w, rstd, dresidual, rows, dim, dw_scratch, stream,
                            accumulate);
  else
    launch_backward<1>(dx, dw, dy, x, w, rstd, dresidual, rows, dim, dw_scratch, stream,
                       accumulate);
}

}  // namespace

void rmsnorm_backward(bf16* dx, float* dw, const bf16* dy, const bf16* x, const bf16* w,
                      const float* rstd, const bf16* dresidual, int64_t rows, int64_t dim,
                      float* dw_scratch, cudaStream_t stream, bool accumulate) {
  backward(dx, dw, dy, x, w, rstd, dresidual, rows, dim, dw_scratch, stream, accumulate);
}

void rmsnorm_backward(bf16* dx, bf16* dw, const bf16* dy, const bf16* x, const bf16* w,
                      const float* rstd, const bf16* dresidual, int64_t rows, int64_t dim,
                      float* dw_scratch, cudaStream_t stream, bool accumulate) {
  FRUGAL_CHECK(dw != nullptr,
               "rmsnorm_backward: a bf16 dw must be given (the fp32 one may be null)");
  backward(dx, dw, dy, x, w, rstd, dresidual, rows, dim, dw_scratch, stream, accumulate);
}

}  // namespace frugal::cuda
