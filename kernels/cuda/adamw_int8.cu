// The fused 8-bit AdamW kernels: a thread block takes one block of state at a time (a grid-stride
// loop over the blocks, so that the code maps are loaded into shared memory once per thread
// block), each thread up to kMaxInt8Block / kThreads of its values: the moments dequantized and
// moved, the block's new absmax a max over the block (order-free, so exactly the CPU twin's),
// the weight updated, the moments requantized. The element math is kernels/blockwise_int8.h's,
// shared with the CPU twin; every result is the twin's bit for bit.
#include <algorithm>
#include <mutex>
#include <vector>

#include "kernels/blockwise_int8.h"
#include "kernels/cuda/adamw_int8.h"
#include "kernels/cuda/cuda_check.h"

namespace frugal::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = int(kMaxInt8Block / kThreads);
constexpr int kMapFloats = 2 * kInt8Codes + 2 * (kInt8Codes - 1);
constexpr unsigned kMaxGrid = 4096;

struct SharedMaps {
  float code[2][kInt8Codes];
  float midpoint[2][kInt8Codes - 1];
};
static_assert(sizeof(SharedMaps) == kMapFloats * sizeof(float));

// The host's maps (cpu::int8_code_maps, so both devices use the same values) in this device's
// memory, uploaded on first use: 4 KB a device for the life of the process.
const float* device_maps() {
  static std::mutex mutex;
  static std::vector<float*> by_device;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (by_device.size() <= size_t(device)) by_device.resize(size_t(device) + 1, nullptr);
  float*& maps = by_device[size_t(device)];
  if (!maps) {
    const cpu::Int8CodeMaps& host = cpu::int8_code_maps();
    SharedMaps flat;
    std::copy(&host.code[0][0], &host.code[0][0] + 2 * kInt8Codes, &flat.code[0][0]);
    std::copy(&host.midpoint[0][0], &host.midpoint[0][0] + 2 * (kInt8Codes - 1),
              &flat.midpoint[0][0]);
    CUDA_CHECK(cudaMalloc(&maps, sizeof flat));
    CUDA_CHECK(cudaMemcpy(maps, &flat, sizeof flat, cudaMemcpyHostToDevice));
  }
  return maps;
}

__device__ void load_maps(SharedMaps& maps, const float* global) {
  float* flat = &maps.code[0][0];
  for (int i = threadIdx.x; i < kMapFloats; i += kThreads) flat[i] = global[i];
  __syncthreads();
}

// The maximum of x over the thread block (every thread gets it).
__device__ float block_max(float x, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = x;
  __syncthreads();
  float out = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) out = fmaxf(out, scratch[w]);
  __syncthreads();  // scratch is reused by the next call
  return out;
}

__device__ float load(const float* p, int64_t i) { return p[i]; }
__device__ float load(const __nv_bfloat16* p, int64_t i) {
  return int8_load_bf16(reinterpret_cast<const uint16_t*>(p)[i]);
}
// The updated weight into an fp32 master, or into a bf16 one as `rounding` says
// (optim.bf16_rounding); a bf16 copy of an fp32 master rounds to nearest.
__device__ void store(float* p, int64_t i, float x, const Bf16Store&) { p[i] = x; }
__device__ void store(__nv_bfloat16* p, int64_t i, float x, const Bf16Store& rounding) {
  reinterpret_cast<uint16_t*>(p)[i] = bf16_store(x, rounding, i);
}
__device__ void store_copy(__nv_bfloat16* p, int64_t i, float x) {
  reinterpret_cast<uint16_t*>(p)[i] = bf16_round_nearest(x);
}

struct Block {
  int64_t index, first, count;
};
__device__ Block block_of(int64_t b, const Int8Layout& l) {
  const int64_t per_row = (l.cols + l.block - 1) / l.block;
  const int64_t row = b / per_row, first_col = (b % per_row) * l.block;
  return {b, row * l.cols + first_col, min(l.block, l.cols - first_col)};
}

// kGalore: the gradient is r (f32), which becomes m / (sqrt(v) + eps); else an AdamW step of
// param (P: float or bf16; grad of the same type), with an optional bf16 copy.
template <class P, bool kGalore>
__global__ void __launch_bounds__(kThreads)
    int8_update_kernel(P* param, const P* grad, Int8Moment m, Int8Moment v, Int8Layout layout,
                       int64_t blocks, Int8AdamScalars c, __nv_bfloat16* param_bf16, float* r,
                       float eps, const float* global_maps, Bf16Store rounding) {
  __shared__ SharedMaps maps;
  __shared__ float scratch[kThreads / 32];
  load_maps(maps, global_maps);
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const Block k = block_of(b, layout);
    const float old1 = m.absmax[b], old2 = v.absmax[b];
    float s1[kPerThread], s2[kPerThread], g[kPerThread];
    float local1 = 0.0f, local2 = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t i = threadIdx.x + int64_t(j) * kThreads;
      if (i >= k.count) break;
      const int64_t e = k.first + i;
      g[j] = kGalore ? r[e] : int8_mul(load(grad, e), c.grad_scale);
      s1[j] = int8_mul(maps.code[0][m.codes[e]], old1);
      s2[j] = int8_mul(maps.code[1][v.codes[e]], old2);
      int8_moments(s1[j], s2[j], g[j], c);
      local1 = fmaxf(local1, fabsf(s1[j]));
      local2 = fmaxf(local2, fabsf(s2[j]));
    }
    const float a1 = block_max(local1, scratch), a2 = block_max(local2, scratch);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t i = threadIdx.x + int64_t(j) * kThreads;
      if (i >= k.count) break;
      const int64_t e = k.first + i;
      if constexpr (kGalore) {
        r[e] = int8_div(s1[j], int8_add(int8_sqrt(s2[j]), eps));
      } else {
        const float p = int8_adam_weight(load(param, e), s1[j], s2[j], g[j], c);
        store(param, e, p, rounding);
        if (param_bf16) store_copy(param_bf16, e, p);
      }
      m.codes[e] = int8_code_signed(maps.code[0], maps.midpoint[0], s1[j], a1);
      v.codes[e] = int8_code_unsigned(maps.midpoint[1], s2[j], a2);
    }
    if (threadIdx.x == 0) {
      m.absmax[b] = a1;
      v.absmax[b] = a2;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    quantize_kernel(Int8Moment q, const float* x, Int8Layout layout, int64_t blocks, bool is_signed,
                    const float* global_maps) {
  __shared__ SharedMaps maps;
  __shared__ float scratch[kThreads / 32];
  load_maps(maps, global_maps);
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const Block k = block_of(b, layout);
    float local = 0.0f;
    for (int64_t i = threadIdx.x; i < k.count; i += kThreads)
      local = fmaxf(local, fabsf(x[k.first + i]));
    const float a = block_max(local, scratch);
    for (int64_t i = threadIdx.x; i < k.count; i += kThreads) {
      const float s = x[k.first + i];
      q.codes[k.first + i] = is_signed ? int8_code_signed(maps.code[0], maps.midpoint[0], s, a)
                                       : int8_code_unsigned(maps.midpoint[1], s, a);
    }
    if (threadIdx.x == 0) q.absmax[b] = a;
  }
}

__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(float* x, Int8Moment q, Int8Layout layout, int64_t blocks, bool is_signed,
                      const float* global_maps) {
  __shared__ SharedMaps maps;
  load_maps(maps, global_maps);
  const float* code = maps.code[is_signed ? 0 : 1];
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const Block k = block_of(b, layout);
    for (int64_t i = threadIdx.x; i < k.count; i += kThreads)
      x[k.first + i] = int8_mul(code[q.codes[k.first + i]], q.absmax[b]);
  }
}

int64_t checked_blocks(const Int8Layout& l) {
  FRUGAL_CHECK(l.block >= 1 && l.block <= kMaxInt8Block && l.rows >= 0 && l.cols >= 0,
               "8-bit state on the GPU: blocks of ", l.block, " values (at most ", kMaxInt8Block,
               ") of ", l.rows, " x ", l.cols);
  return l.rows * l.blocks_per_row();
}
unsigned grid(int64_t blocks) { return unsigned(std::min<int64_t>(blocks, kMaxGrid)); }

template <class P>
void launch_update(P* param, const P* grad, Int8Moment m, Int8Moment v, const Int8Layout& layout,
                   const cpu::AdamWStep& s, __nv_bfloat16* param_bf16, const Bf16Store& rounding,
                   cudaStream_t stream) {
  const int64_t blocks = checked_blocks(layout);
  const Int8AdamScalars c = cpu::int8_adam_scalars(s);
  if (blocks == 0) return;
  int8_update_kernel<P, false><<<grid(blocks), kThreads, 0, stream>>>(
      param, grad, m, v, layout, blocks, c, param_bf16, nullptr, 0.0f, device_maps(), rounding);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_int8_update(float* param, const float* grad, Int8Moment m, Int8Moment v,
                       const Int8Layout& layout, const cpu::AdamWStep& s, __nv_bfloat16* param_bf16,
                       cudaStream_t stream) {
  launch_update(param, grad, m, v, layout, s, param_bf16, Bf16Store(), stream);
}

void adamw_int8_update(__nv_bfloat16* param, const __nv_bfloat16* grad, Int8Moment m, Int8Moment v,
                       const Int8Layout& layout, const cpu::AdamWStep& s, const Bf16Store& store,
                       cudaStream_t stream) {
  launch_update(param, grad, m, v, layout, s, nullptr, store, stream);
}

void galore_moments_int8(Int8Moment m, Int8Moment v, float* r, const Int8Layout& layout,
                         float beta1, float beta2, float eps, cudaStream_t stream) {
  const int64_t blocks = checked_blocks(layout);
  cpu::AdamWStep s;
  s.beta1 = beta1;
  s.beta2 = beta2;
  const Int8AdamScalars c = cpu::int8_adam_scalars(s);
  if (blocks == 0) return;
  int8_update_kernel<float, true><<<grid(blocks), kThreads, 0, stream>>>(
      nullptr, nullptr, m, v, layout, blocks, c, nullptr, r, eps, device_maps(), Bf16Store());
  CUDA_CHECK_LAUNCH();
}

void quantize_blockwise(Int8Moment q, const float* x, const Int8Layout& layout, bool is_signed,
                        cudaStream_t stream) {
  const int64_t blocks = checked_blocks(layout);
  if (blocks == 0) return;
  quantize_kernel<<<grid(blocks), kThreads, 0, stream>>>(q, x, layout, blocks, is_signed,
                                                         device_maps());
  CUDA_CHECK_LAUNCH();
}

void dequantize_blockwise(float* x, Int8Moment q, const Int8Layout& layout, bool is_signed,
                          cudaStream_t stream) {
  const int64_t blocks = checked_blocks(layout);
  if (blocks == 0) return;
  dequantize_kernel<<<grid(blocks), kThreads, 0, stream>>>(x, q, layout, blocks, is_signed,
                                                           device_maps());
  CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::cuda
