// Multi-tensor AdamW on the GPU (torch.optim.AdamW's formula, as frugal::cpu::adamw_update) and
// the deterministic sum of squares for global-norm gradient clipping.
//
// AdamW: one launch covers up to kAdamWChunksPerLaunch tensors, whose pointers, sizes and block
// offsets travel in the kernel's argument block (under the 4 KiB classic limit), so no device
// table has to be allocated or copied. Each block updates 1024 consecutive elements of one
// chunk, found by binary search over the chunks' first blocks. Where a chunk's fp32 arrays are
// 16-byte aligned, each thread moves 4 elements with one float4 access per array (and one
// 8-byte store for the bf16 copy). The per-step scalars are computed on the host in double, as
// the CPU kernel does, and the element math uses explicitly rounded intrinsics (__fmul_rn, ...)
// so nvcc cannot fuse a multiply-add: the result is the CPU's bit for bit.
// Sum of squares: pass 1 runs a grid of at most kSumSquaresScratch blocks (a function of n
// only), each thread accumulating x^2 in fp64 over a grid-stride loop and each block reducing by
// shuffles into one partial; pass 2, a single block, sums the partials in a fixed order. Same
// grid and same order on every run: bitwise reproducible. grad_health is the same two passes
// with the health monitor's counts beside the sum (frugal::cpu::grad_health's twin).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/pack16.cuh"

namespace frugal::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kAdamWThreads = 256;
constexpr int kElemsPerThread = 4;  // one float4
constexpr int64_t kBlockElems = int64_t{kAdamWThreads} * kElemsPerThread;
constexpr int kSumThreads = 256;
constexpr int kSumFinalThreads = 1024;

// The chunk table of one launch, passed by value as the kernel's argument.
template <class Chunk>
struct ChunkBatch {
  Chunk chunk[kAdamWChunksPerLaunch];
  int64_t first_block[kAdamWChunksPerLaunch + 1];  // chunk c owns blocks [first[c], first[c+1])
  bool vec[kAdamWChunksPerLaunch];                 // vector path allowed for chunk c
  int n_chunks;
};
using AdamWBatch = ChunkBatch<AdamWChunk>;
using AdamWBatchBf16 = ChunkBatch<AdamWChunkBf16>;
using AdamWBatchBf16Master = ChunkBatch<AdamWChunkBf16Master>;

// The last chunk whose first block is <= block (binary search over the table).
template <class Batch>
__device__ __forceinline__ int chunk_of_block(const Batch& batch, int64_t block) {
  int lo = 0, hi = batch.n_chunks - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (batch.first_block[mid] <= block)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Per-step scalars, folded on the host by the CPU kernel's own function.
using cpu::adamw_scalars;
using cpu::AdamWScalars;

static_assert(sizeof(AdamWBatch) + sizeof(AdamWScalars) <= 4096,
              "adamw_kernel's arguments must fit the classic 4 KiB kernel argument limit");
static_assert(sizeof(AdamWBatchBf16) + sizeof(AdamWScalars) <= 4096,
              "adamw_bf16_kernel's arguments must fit the classic 4 KiB kernel argument limit");
static_assert(sizeof(AdamWBatchBf16Master) + sizeof(AdamWScalars) <= 4096,
              "adamw_bf16_kernel's arguments must fit the classic 4 KiB kernel argument limit");

// One element, rounded step by step exactly as the CPU loop.
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g_raw,
                                              const AdamWScalars& s) {
  const float g = __fmul_rn(g_raw, s.grad_scale);
  p = __fmul_rn(p, s.decay);                                     // param.mul_(1 - lr * wd)
  m = __fadd_rn(m, __fmul_rn(s.one_minus_b1, __fsub_rn(g, m)));  // exp_avg.lerp_(grad, 1 - b1)
  v = __fadd_rn(__fmul_rn(v, s.beta2), __fmul_rn(__fmul_rn(s.one_minus_b2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  p = __fsub_rn(p, __fmul_rn(s.step_size, __fdiv_rn(m, denom)));
}

__device__ __forceinline__ void adamw_scalar(const AdamWChunk& c, int64_t i,
                                             const AdamWScalars& s) {
  float p = c.param[i], m = c.m[i], v = c.v[i];
  adamw_element(p, m, v, c.grad[i], s);
  c.param[i] = p;
  c.m[i] = m;
  c.v[i] = v;
  if (c.param_bf16 != nullptr) c.param_bf16[i] = __float2bfloat16_rn(p);
}

__global__ void adamw_kernel(const AdamWBatch batch, const AdamWScalars s) {
  const int64_t b = blockIdx.x;
  const int lo = chunk_of_block(batch, b);
  const AdamWChunk& c = batch.chunk[lo];
  const int64_t e0 = (b - batch.first_block[lo]) * kBlockElems;

  if (batch.vec[lo]) {
    const int64_t i = e0 + static_cast<int64_t>(threadIdx.x) * kElemsPerThread;
    if (i + kElemsPerThread <= c.n) {
      float4 p = *reinterpret_cast<const float4*>(c.param + i);
      float4 m = *reinterpret_cast<const float4*>(c.m + i);
      float4 v = *reinterpret_cast<const float4*>(c.v + i);
      const float4 g = *reinterpret_cast<const float4*>(c.grad + i);
      adamw_element(p.x, m.x, v.x, g.x, s);
      adamw_element(p.y, m.y, v.y, g.y, s);
      adamw_element(p.z, m.z, v.z, g.z, s);
      adamw_element(p.w, m.w, v.w, g.w, s);
      *reinterpret_cast<float4*>(c.param + i) = p;
      *reinterpret_cast<float4*>(c.m + i) = m;
      *reinterpret_cast<float4*>(c.v + i) = v;
      if (c.param_bf16 != nullptr) {
        // Four bf16, one 8-byte store: (i * 2 bytes) is a multiple of 8 and the base is checked.
        const __nv_bfloat162 lo2 = __floats2bfloat162_rn(p.x, p.y);
        const __nv_bfloat162 hi2 = __floats2bfloat162_rn(p.z, p.w);
        uint2 raw;
        memcpy(&raw.x, &lo2, sizeof(raw.x));
        memcpy(&raw.y, &hi2, sizeof(raw.y));
        *reinterpret_cast<uint2*>(c.param_bf16 + i) = raw;
      }
    } else {
      for (int64_t k = i; k < c.n; ++k) adamw_scalar(c, k, s);
    }
  } else {
    for (int k = 0; k < kElemsPerThread; ++k) {
      const int64_t i = e0 + static_cast<int64_t>(k) * blockDim.x + threadIdx.x;
      if (i < c.n) adamw_scalar(c, i, s);
    }
  }
}

// bf16 storage: widened, updated by the fp32 element math, each result rounded once (the whole
// update moves 14 bytes per weight with bf16 moments, 22 with fp32 ones): the moments to nearest
// even, the weight by the chunk's store (stochastic rounding draws element i's bits from its
// index in the full parameter, as the CPU does). Where a chunk's arrays are aligned each thread
// moves its 4 elements with one access per array (8 bytes for bf16, 16 for fp32), as the fp32
// kernel's float4: scalar 2-byte accesses reached only about 60 % of the memory bandwidth on an
// H200.
__device__ __forceinline__ float widen_f(float x) { return x; }
__device__ __forceinline__ float widen_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void narrow_into(float& dst, float x) { dst = x; }
__device__ __forceinline__ void narrow_into(bf16& dst, float x) { dst = __float2bfloat16_rn(x); }

template <class Chunk>
__device__ __forceinline__ void adamw_bf16_scalar(const Chunk& c, int64_t i,
                                                  const AdamWScalars& s) {
  float p = __bfloat162float(c.param[i]), m = widen_f(c.m[i]), v = widen_f(c.v[i]);
  adamw_element(p, m, v, __bfloat162float(c.grad[i]), s);
  c.param[i] = __ushort_as_bfloat16(bf16_store(p, c.store, i));
  narrow_into(c.m[i], m);
  narrow_into(c.v[i], v);
}

// Four consecutive values widened to fp32, from one 8-byte (bf16) or 16-byte (fp32) access; and
// back, the moments rounded to nearest even, the weight by the store.
template <class T>
struct Wide4 {
  float x[kElemsPerThread];
  __device__ __forceinline__ explicit Wide4(const T* p) {
    if constexpr (std::is_same_v<T, float>) {
      const float4 raw = *reinterpret_cast<const float4*>(p);
      x[0] = raw.x;
      x[1] = raw.y;
      x[2] = raw.z;
      x[3] = raw.w;
    } else {
      const uint2 raw = *reinterpret_cast<const uint2*>(p);
      bf16 h[kElemsPerThread];
      memcpy(h, &raw, sizeof(raw));
#pragma unroll
      for (int k = 0; k < kElemsPerThread; ++k) x[k] = __bfloat162float(h[k]);
    }
  }
  __device__ __forceinline__ void store(T* p) const {
    if constexpr (std::is_same_v<T, float>) {
      *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
      bf16 h[kElemsPerThread];
#pragma unroll
      for (int k = 0; k < kElemsPerThread; ++k) h[k] = __float2bfloat16_rn(x[k]);
      uint2 raw;
      memcpy(&raw, h, sizeof(raw));
      *reinterpret_cast<uint2*>(p) = raw;
    }
  }
  // A bf16 master's four weights, elements i.. of the chunk, stored by `rounding`.
  __device__ __forceinline__ void store_master(bf16* p, const Bf16Store& rounding,
                                               int64_t i) const {
    uint16_t h[kElemsPerThread];
#pragma unroll
    for (int k = 0; k < kElemsPerThread; ++k) h[k] = bf16_store(x[k], rounding, i + k);
    uint2 raw;
    memcpy(&raw, h, sizeof(raw));
    *reinterpret_cast<uint2*>(p) = raw;
  }
};

template <class Chunk>
__global__ void adamw_bf16_kernel(const ChunkBatch<Chunk> batch, const AdamWScalars s) {
  using Moment = std::remove_pointer_t<decltype(Chunk::m)>;
  const int64_t b = blockIdx.x;
  const int k = chunk_of_block(batch, b);
  const Chunk& c = batch.chunk[k];
  const int64_t e0 = (b - batch.first_block[k]) * kBlockElems;
  if (batch.vec[k]) {
    const int64_t i = e0 + static_cast<int64_t>(threadIdx.x) * kElemsPerThread;
    if (i + kElemsPerThread <= c.n) {
      Wide4<bf16> p(c.param + i);
      Wide4<Moment> m(c.m + i), v(c.v + i);
      const Wide4<bf16> g(c.grad + i);
#pragma unroll
      for (int e = 0; e < kElemsPerThread; ++e) adamw_element(p.x[e], m.x[e], v.x[e], g.x[e], s);
      p.store_master(c.param + i, c.store, i);
      m.store(c.m + i);
      v.store(c.v + i);
    } else {
      for (int64_t q = i; q < c.n; ++q) adamw_bf16_scalar(c, q, s);
    }
    return;
  }
  for (int r = 0; r < kElemsPerThread; ++r) {
    const int64_t i = e0 + static_cast<int64_t>(r) * blockDim.x + threadIdx.x;
    if (i < c.n) adamw_bf16_scalar(c, i, s);
  }
}

bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

// Whether a chunk's arrays allow the vector path (16-byte fp32 accesses, 8-byte bf16 copy
// stores; 8-byte accesses for bf16 chunks).
bool vector_path(const AdamWChunk& c) {
  return all_aligned16(c.param, c.grad, c.m, c.v) && aligned8(c.param_bf16);
}
bool vector_path(const AdamWChunkBf16& c) {
  return aligned8(c.param) && aligned8(c.grad) && aligned8(c.m) && aligned8(c.v);
}
bool vector_path(const AdamWChunkBf16Master& c) {
  return aligned8(c.param) && aligned8(c.grad) && all_aligned16(c.m, c.v);
}

// The chunks in launches of at most kAdamWChunksPerLaunch, each chunk's blocks found by the
// kernel from the table's first blocks.
template <class Chunk>
void launch_adamw(void (*kernel)(ChunkBatch<Chunk>, AdamWScalars), const Chunk* chunks,
                  int64_t n_chunks, const AdamWStep& step, cudaStream_t stream) {
  const AdamWScalars s = adamw_scalars(step);
  for (int64_t c0 = 0; c0 < n_chunks; c0 += kAdamWChunksPerLaunch) {
    ChunkBatch<Chunk> batch{};
    batch.n_chunks = static_cast<int>(std::min<int64_t>(kAdamWChunksPerLaunch, n_chunks - c0));
    int64_t blocks = 0;
    for (int k = 0; k < batch.n_chunks; ++k) {
      const Chunk& c = chunks[c0 + k];
      FRUGAL_CHECK(c.n >= 0, "adamw_update: chunk ", c0 + k, " has n = ", c.n);
      FRUGAL_CHECK(c.n == 0 || (c.param && c.grad && c.m && c.v), "adamw_update: chunk ", c0 + k,
                   " has a null pointer");
      batch.chunk[k] = c;
      batch.first_block[k] = blocks;
      batch.vec[k] = vector_path(c);
      blocks += (c.n + kBlockElems - 1) / kBlockElems;
    }
    batch.first_block[batch.n_chunks] = blocks;
    if (blocks == 0) continue;
    FRUGAL_CHECK(blocks <= INT32_MAX, "adamw_update: ", blocks, " blocks in one launch");
    kernel<<<static_cast<unsigned>(blocks), kAdamWThreads, 0, stream>>>(batch, s);
    CUDA_CHECK_LAUNCH();
  }
}

__device__ __forceinline__ double widen(float x) { return x; }
__device__ __forceinline__ double widen(bf16 x) { return __bfloat162float(x); }

// The health counts of one value (as frugal::cpu::grad_health): not finite; finite and cast to
// bf16 (round to nearest even) zero or subnormal, or inf. A bf16 value is its own cast.
struct HealthCounts {
  double nonfinite = 0, underflow = 0, overflow = 0;
  __device__ __forceinline__ void add(float x) {
    const unsigned u = __float_as_uint(x) & 0x7FFFFFFFu;
    nonfinite += u >= 0x7F800000u;
    underflow += u != 0 && u < 0x007F8000u;
    overflow += u >= 0x7F7F8000u && u < 0x7F800000u;
  }
  __device__ __forceinline__ void add(bf16 x) {
    const unsigned u = __bfloat16_as_ushort(x) & 0x7FFFu;
    nonfinite += u >= 0x7F80u;
  }
};

// Pass 1 of sum_squares: partial[blockIdx.x] = this block's share, in fp64, one 16-byte pack (4
// fp32 or 8 bf16 values, a bf16 run's gradients) at a time where x is aligned. kCount
// (grad_health): also the counts, into partial[gridDim.x * (1 + j) + blockIdx.x]; the sum is the
// same code, so it equals sum_squares' bit for bit. Counts of up to 2^53 are exact in fp64.
// One thread's share of the x[i]^2 (kCount: and of the health counts): the values first,
// first + stride, ... of x, taken as 16-byte packs where vec (x aligned), the tail one by one.
template <class T, bool kCount>
__device__ __forceinline__ double squares_share(const T* x, int64_t n, int64_t first,
                                                int64_t stride, bool vec, HealthCounts& counts) {
  constexpr int kP = kPack<T>;
  double acc = 0.0;
  int64_t packs = 0;
  if (vec) {
    packs = n / kP;
    for (int64_t q = first; q < packs; q += stride) {
      const uint4 raw = *reinterpret_cast<const uint4*>(x + kP * q);
      T v[kP];
      memcpy(v, &raw, sizeof(raw));
#pragma unroll
      for (int k = 0; k < kP; ++k) {
        acc += widen(v[k]) * widen(v[k]);
        if constexpr (kCount) counts.add(v[k]);
      }
    }
  }
  for (int64_t i = kP * packs + first; i < n; i += stride) {
    acc += widen(x[i]) * widen(x[i]);
    if constexpr (kCount) counts.add(x[i]);
  }
  return acc;
}

template <class T, bool kVec, bool kCount>
__global__ void sum_squares_partial_kernel(double* partial, const T* x, int64_t n) {
  __shared__ double scratch[kWarpSize];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  HealthCounts counts;
  double acc = squares_share<T, kCount>(x, n, first, stride, kVec, counts);
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
  if constexpr (kCount) {
    const double c[3] = {block_sum(counts.nonfinite, scratch), block_sum(counts.underflow, scratch),
                         block_sum(counts.overflow, scratch)};
    if (threadIdx.x == 0)
      for (int j = 0; j < 3; ++j) partial[gridDim.x * (1 + j) + blockIdx.x] = c[j];
  }
}

// Pass 2: one block sums the partials in a fixed order.
__global__ void sum_squares_final_kernel(double* out, const double* partial, int64_t n_partials,
                                         bool accumulate) {
  __shared__ double scratch[kWarpSize];
  double acc = 0.0;
  for (int64_t b = threadIdx.x; b < n_partials; b += blockDim.x) acc += partial[b];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = accumulate ? *out + acc : acc;
}

// sum_squares_many: chunk c's blocks [first[c], first[c+1]) each take a grid-stride share of
// its values (16-byte packs where aligned) and write one partial. A block per 8 packs a thread,
// up to 1024 (a cap of 32 left the 65M-value embedding and head to 8192 threads: 1.35 ms a step).
inline constexpr int kSquaresChunksPerLaunch = 64;
inline constexpr int64_t kSquaresBlocksPerChunk = 1024;
struct SquaresBatch {
  SquaresChunk chunk[kSquaresChunksPerLaunch];
  int first_block[kSquaresChunksPerLaunch + 1];
  int n_chunks;
};
static_assert(sizeof(SquaresBatch) <= 4096, "sum_squares_many's arguments must fit 4 KiB");

template <class T>
__device__ __forceinline__ double chunk_squares(const T* x, int64_t n, int64_t first,
                                                int64_t stride) {
  HealthCounts unused;
  return squares_share<T, false>(x, n, first, stride, reinterpret_cast<uintptr_t>(x) % 16 == 0,
                                 unused);
}

__global__ void sum_squares_many_kernel(double* partial, const SquaresBatch batch) {
  __shared__ double scratch[kWarpSize];
  const int b = static_cast<int>(blockIdx.x);
  const int c = chunk_of_block(batch, b);
  const SquaresChunk& chunk = batch.chunk[c];
  const int64_t blocks = batch.first_block[c + 1] - batch.first_block[c];
  const int64_t first = static_cast<int64_t>(b - batch.first_block[c]) * blockDim.x + threadIdx.x;
  const int64_t stride = blocks * blockDim.x;
  double acc = chunk.f32 != nullptr ? chunk_squares(chunk.f32, chunk.n, first, stride)
                                    : chunk_squares(chunk.bf16, chunk.n, first, stride);
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[b] = acc;
}

// grad_health's pass 2: out[j] = the sum of partial row j (row 0 as sum_squares sums it).
__global__ void grad_health_final_kernel(double* out, const double* partial, int64_t n_partials) {
  __shared__ double scratch[kWarpSize];
  for (int j = 0; j < kGradHealthValues; ++j) {
    double acc = 0.0;
    for (int64_t b = threadIdx.x; b < n_partials; b += blockDim.x)
      acc += partial[j * n_partials + b];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[j] = acc;
  }
}

// The grid of pass 1, a function of n alone.
int64_t sum_squares_blocks(int64_t items) {
  return std::clamp<int64_t>((items + kSumThreads - 1) / kSumThreads, 1, kSumSquaresScratch);
}

template <class T>
void launch_sum_squares(double* out, const T* x, int64_t n, bool accumulate, double* scratch,
                        cudaStream_t stream) {
  FRUGAL_CHECK(n >= 0, "sum_squares: n = ", n);
  FRUGAL_CHECK(scratch != nullptr && out != nullptr, "sum_squares: null out or scratch");
  const bool vec = aligned16(x);
  const int64_t blocks = sum_squares_blocks(vec ? (n + kPack<T> - 1) / kPack<T> : n);
  if (vec)
    sum_squares_partial_kernel<T, true, false>
        <<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(scratch, x, n);
  else
    sum_squares_partial_kernel<T, false, false>
        <<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(scratch, x, n);
  CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kSumFinalThreads, 0, stream>>>(out, scratch, blocks, accumulate);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_grad_health(double* out, const T* x, int64_t n, double* scratch, cudaStream_t stream) {
  FRUGAL_CHECK(n >= 0, "grad_health: n = ", n);
  FRUGAL_CHECK(scratch != nullptr && out != nullptr, "grad_health: null out or scratch");
  const bool vec = aligned16(x);
  const int64_t blocks = sum_squares_blocks(vec ? (n + kPack<T> - 1) / kPack<T> : n);
  if (vec)
    sum_squares_partial_kernel<T, true, true>
        <<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(scratch, x, n);
  else
    sum_squares_partial_kernel<T, false, true>
        <<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(scratch, x, n);
  CUDA_CHECK_LAUNCH();
  grad_health_final_kernel<<<1, kSumFinalThreads, 0, stream>>>(out, scratch, blocks);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_update(const AdamWChunk* chunks, int64_t n_chunks, const AdamWStep& step,
                  cudaStream_t stream) {
  launch_adamw(adamw_kernel, chunks, n_chunks, step, stream);
}

void sum_squares(double* out, const float* x, int64_t n, bool accumulate, double* scratch,
                 cudaStream_t stream) {
  launch_sum_squares(out, x, n, accumulate, scratch, stream);
}

void adamw_update(const AdamWChunkBf16* chunks, int64_t n_chunks, const AdamWStep& step,
                  cudaStream_t stream) {
  launch_adamw(adamw_bf16_kernel<AdamWChunkBf16>, chunks, n_chunks, step, stream);
}

void adamw_update(const AdamWChunkBf16Master* chunks, int64_t n_chunks, const AdamWStep& step,
                  cudaStream_t stream) {
  launch_adamw(adamw_bf16_kernel<AdamWChunkBf16Master>, chunks, n_chunks, step, stream);
}

void sum_squares(double* out, const bf16* x, int64_t n, bool accumulate, double* scratch,
                 cudaStream_t stream) {
  launch_sum_squares(out, x, n, accumulate, scratch, stream);
}

void sum_squares_many(double* out, const SquaresChunk* chunks, int64_t n_chunks, double* scratch,
                      cudaStream_t stream) {
  FRUGAL_CHECK(out != nullptr && scratch != nullptr, "sum_squares_many: null out or scratch");
  bool accumulate = false;
  int64_t c = 0;
  do {  // at least one launch: with no chunks *out = 0
    SquaresBatch batch{};
    int blocks = 0;
    while (c < n_chunks && batch.n_chunks < kSquaresChunksPerLaunch) {
      const SquaresChunk& chunk = chunks[c];
      FRUGAL_CHECK(chunk.n >= 0 && (chunk.f32 == nullptr) != (chunk.bf16 == nullptr),
                   "sum_squares_many: chunk ", c, " needs one of f32, bf16 and n >= 0");
      const int64_t items = chunk.f32 != nullptr ? (chunk.n + 3) / 4 : (chunk.n + 7) / 8;
      const int64_t want = std::clamp<int64_t>((items + 8 * kSumThreads - 1) / (8 * kSumThreads), 1,
                                               kSquaresBlocksPerChunk);
      if (blocks + want > kSumSquaresManyScratch) break;
      batch.chunk[batch.n_chunks] = chunk;
      batch.first_block[batch.n_chunks] = blocks;
      blocks += static_cast<int>(want);
      ++batch.n_chunks;
      ++c;
    }
    batch.first_block[batch.n_chunks] = blocks;
    if (blocks > 0) {
      sum_squares_many_kernel<<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(scratch,
                                                                                         batch);
      CUDA_CHECK_LAUNCH();
    }
    sum_squares_final_kernel<<<1, kSumFinalThreads, 0, stream>>>(out, scratch, blocks, accumulate);
    CUDA_CHECK_LAUNCH();
    accumulate = true;
  } while (c < n_chunks);
}

void grad_health(double* out, const float* x, int64_t n, double* scratch, cudaStream_t stream) {
  launch_grad_health(out, x, n, scratch, stream);
}

void grad_health(double* out, const bf16* x, int64_t n, double* scratch, cudaStream_t stream) {
  launch_grad_health(out, x, n, scratch, stream);
}

}  // namespace frugal::cuda
