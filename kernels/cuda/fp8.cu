// FP8 casts on the GPU; see fp8.h. Bit-exact twins of kernels/cpu/fp8.cpp: the product x * scale
// is one fp32 multiply (__fmul_rn, never fused), encoded by the hardware's saturating
// round-to-nearest-even conversion (cvt.rn.satfinite on sm_89+; cuda_fp8.h's software twin of
// it below that), and the amax is the maximum of |x|'s bit patterns, as on the CPU.
//
// The cast works on 64 x 64 tiles, 256 threads: each thread loads 8 bf16 (16 bytes) of a row,
// stores their 8 codes (8 bytes) to the plain copy and to a shared tile, and after a barrier
// gathers 8 codes down a column of the tile for the transposed copy, so both outputs are written
// in 8-byte pieces of contiguous rows. One block's amax and counts go out in one atomic each.
//
// What the cast reads is a type (Bf16Rows, or a 4-bit weight: Nf4Rows, HqqRows): the 4-bit ones
// expand their codes as the dequantization does (four_bit.cuh) and round to bf16, so the codes of
// a 4-bit weight are those of its bf16 dequantization, without writing and reading that matrix.
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/four_bit.cuh"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/pack16.cuh"

namespace frugal::cuda {

namespace {

constexpr int kTile = 64;
constexpr int kThreads = 256;
static_assert(kGroup == 8 && kFourBitGroup == kGroup);  // elements per thread and load
constexpr int kTileStride = kTile + 8;  // shared tile row: 8-byte aligned, fewer bank conflicts
constexpr int kWarps = kThreads / 32;

template <Fp8Format F>
__device__ __forceinline__ uint8_t encode(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, F == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
}

template <Fp8Format F>
constexpr float max_value() {
  return F == Fp8Format::e4m3 ? 448.0f : 57344.0f;
}

// cpu::fp8_scale_from_amax.
__device__ __forceinline__ float scale_from_amax(float amax, float previous, float max_value,
                                                 int margin) {
  if (!(amax > 0.0f) || !isfinite(amax)) return previous;
  const float scale = ldexpf(__fdiv_rn(max_value, amax), -margin);
  return isfinite(scale) ? scale : FLT_MAX;
}

__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

// What a cast reads: load(v, first) puts the bf16 values first .. first + 7 of the row-major
// matrix into v as floats (first a multiple of 8).
struct Bf16Rows {
  const __nv_bfloat16* x;
  __device__ __forceinline__ void load(float* v, int64_t first) const { load_pack(v, x + first); }
};

__device__ __forceinline__ void round_to_bf16(float* v) {
#pragma unroll
  for (int k = 0; k < kGroup; ++k) v[k] = __bfloat162float(__float2bfloat16_rn(v[k]));
}

struct Nf4Rows {
  Nf4Device w;
  Nf4Tables tables;
  __device__ __forceinline__ void load(float* v, int64_t first) const {
    nf4_eight(v, w, tables, first);
    round_to_bf16(v);
  }
};

struct HqqRows {
  HqqDevice w;
  __device__ __forceinline__ void load(float* v, int64_t first) const {
    hqq_eight(v, w, first);
    round_to_bf16(v);
  }
};

// The block's max of `amax` and sums of the counts, then one atomic each (thread 0).
__device__ __forceinline__ void publish(unsigned amax, unsigned flushed, unsigned saturated,
                                        const Fp8CastState& s) {
  __shared__ unsigned warp_amax[kWarps], warp_flushed[kWarps], warp_saturated[kWarps];
  amax = __reduce_max_sync(0xffffffffu, amax);
  flushed = __reduce_add_sync(0xffffffffu, flushed);
  saturated = __reduce_add_sync(0xffffffffu, saturated);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    warp_amax[warp] = amax;
    warp_flushed[warp] = flushed;
    warp_saturated[warp] = saturated;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  unsigned long long f = 0, sat = 0;
  for (int w = 0; w < kWarps; ++w) {
    amax = max(amax, warp_amax[w]);
    f += warp_flushed[w];
    sat += warp_saturated[w];
  }
  if (s.amax) atomicMax(reinterpret_cast<unsigned*>(s.amax), amax);
  auto* counts = reinterpret_cast<unsigned long long*>(s.counts);
  if (f) atomicAdd(counts + 1, f);
  if (sat) atomicAdd(counts + 2, sat);
}

template <Fp8Format F, class Source>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_kernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                          const __grid_constant__ Source x, int64_t rows, int64_t cols,
                          Fp8CastState s) {
  __shared__ __align__(8) uint8_t tile[kTile * kTileStride];
  float scale = *s.scale;
  if (s.current_amax) {
    // Every block computes the same scale; one writes it back. A block that reads *s.scale after
    // that write computes the same value: the write differs from the old scale only when the
    // amax decides it, and then the old scale is not used.
    scale = scale_from_amax(*s.current_amax, scale, max_value<F>(), s.margin);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
      *s.scale = scale;
      *s.scale_inv = 1.0f / scale;
    }
  }
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
    atomicAdd(reinterpret_cast<unsigned long long*>(s.counts), (unsigned long long)(rows * cols));

  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int group = threadIdx.x % (kTile / kGroup);     // 8 groups of 8 columns (or rows)
  const int lane_row = threadIdx.x / (kTile / kGroup);  // 0..31
  unsigned amax = 0, flushed = 0, saturated = 0;

#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int r = lane_row + 32 * pass;
    const int64_t gr = r0 + r, gc = c0 + group * kGroup;
    if (gr >= rows || gc >= cols) continue;
    float v[kGroup];
    x.load(v, gr * cols + gc);
    uint8_t codes[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const float xv = v[j];
      const float scaled = __fmul_rn(xv, scale);
      const uint8_t code = encode<F>(scaled);
      codes[j] = code;
      amax = max(amax, abs_bits(xv));
      flushed += xv != 0.0f && !isnan(xv) && (code & 0x7F) == 0;
      saturated += fabsf(scaled) > max_value<F>();
    }
    const uint2 packed = *reinterpret_cast<const uint2*>(codes);
    if (out) *reinterpret_cast<uint2*>(out + gr * cols + gc) = packed;
    *reinterpret_cast<uint2*>(tile + r * kTileStride + group * kGroup) = packed;
  }
  if (out_t) {
    __syncthreads();
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int c = lane_row + 32 * pass;
      const int64_t gc = c0 + c, gr = r0 + group * kGroup;
      if (gc >= cols || gr >= rows) continue;
      uint8_t codes[kGroup];
#pragma unroll
      for (int j = 0; j < kGroup; ++j) codes[j] = tile[(group * kGroup + j) * kTileStride + c];
      *reinterpret_cast<uint2*>(out_t + gc * rows + gr) = *reinterpret_cast<const uint2*>(codes);
    }
  }
  publish(amax, flushed, saturated, s);
}

template <class Source>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(float* amax_out, const __grid_constant__ Source x, int64_t groups) {
  unsigned amax = 0;
  for (int64_t g = int64_t(blockIdx.x) * kThreads + threadIdx.x; g < groups;
       g += int64_t(gridDim.x) * kThreads) {
    float v[kGroup];
    x.load(v, g * kGroup);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) amax = max(amax, abs_bits(v[j]));
  }
  __shared__ unsigned warp_amax[kWarps];
  amax = __reduce_max_sync(0xffffffffu, amax);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 0; w < kWarps; ++w) amax = max(amax, warp_amax[w]);
  atomicMax(reinterpret_cast<unsigned*>(amax_out), amax);
}

__global__ void delayed_update_kernel(float* history, float* scale, float* scale_inv,
                                      const float* max_values, int64_t history_len, int64_t slots,
                                      int margin) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= slots) return;
  unsigned amax = 0;
  for (int64_t i = 0; i < history_len; ++i) amax = max(amax, abs_bits(history[i * slots + s]));
  scale[s] = scale_from_amax(__uint_as_float(amax), scale[s], max_values[s], margin);
  scale_inv[s] = 1.0f / scale[s];
  for (int64_t i = history_len - 1; i > 0; --i)
    history[i * slots + s] = history[(i - 1) * slots + s];
  history[s] = 0.0f;
}

template <Fp8Format F>
__global__ void dequantize_kernel(__nv_bfloat16* __restrict__ out,
                                  const uint8_t* __restrict__ codes, int64_t n,
                                  const float* scale_inv) {
  const float s = *scale_inv;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v;
    if constexpr (F == Fp8Format::e4m3) {
      __nv_fp8_e4m3 c;
      c.__x = codes[i];
      v = float(c);
    } else {
      __nv_fp8_e5m2 c;
      c.__x = codes[i];
      v = float(c);
    }
    out[i] = __float2bfloat16_rn(__fmul_rn(v, s));
  }
}

// One 32 x 32 tile per block of 32 x 8 threads, through shared memory so that both the reads
// and the writes are along rows (coalesced); the extra column keeps the column reads free of
// bank conflicts.
__global__ void transpose_codes_kernel(uint8_t* __restrict__ out, const uint8_t* __restrict__ in,
                                       int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[32][33];
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][i];
  }
}

}  // namespace

void fp8_transpose_codes(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32));
  FRUGAL_CHECK(grid.y <= 65535, "fp8 transpose of ", rows, " rows: too many for one grid");
  transpose_codes_kernel<<<grid, dim3(32, 8), 0, stream>>>(out, in, rows, cols);
  CUDA_CHECK_LAUNCH();
}

void fp8_dequantize(__nv_bfloat16* out, const uint8_t* codes, int64_t n, Fp8Format format,
                    const float* scale_inv, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  if (format == Fp8Format::e4m3)
    dequantize_kernel<Fp8Format::e4m3>
        <<<unsigned(blocks), kThreads, 0, stream>>>(out, codes, n, scale_inv);
  else
    dequantize_kernel<Fp8Format::e5m2>
        <<<unsigned(blocks), kThreads, 0, stream>>>(out, codes, n, scale_inv);
  CUDA_CHECK_LAUNCH();
}

namespace {

template <class Source>
void cast_transpose(uint8_t* out, uint8_t* out_t, const Source& x, int64_t rows, int64_t cols,
                    Fp8Format format, const Fp8CastState& state, cudaStream_t stream) {
  FRUGAL_CHECK(rows % 16 == 0 && cols % 16 == 0, "fp8 cast of [", rows, ", ", cols,
               "]: rows and columns must be multiples of 16");
  FRUGAL_CHECK(
      reinterpret_cast<uintptr_t>(out) % 16 == 0 && reinterpret_cast<uintptr_t>(out_t) % 16 == 0,
      "fp8 cast: pointers must be 16-byte aligned");
  if (rows == 0 || cols == 0) return;
  const dim3 grid(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile));
  FRUGAL_CHECK(grid.y <= 65535, "fp8 cast of ", rows, " rows: too many for one grid");
  if (format == Fp8Format::e4m3)
    cast_transpose_kernel<Fp8Format::e4m3, Source>
        <<<grid, kThreads, 0, stream>>>(out, out_t, x, rows, cols, state);
  else
    cast_transpose_kernel<Fp8Format::e5m2, Source>
        <<<grid, kThreads, 0, stream>>>(out, out_t, x, rows, cols, state);
  CUDA_CHECK_LAUNCH();
}

template <class Source>
void amax_of(float* amax, const Source& x, int64_t n, cudaStream_t stream) {
  FRUGAL_CHECK(n % kGroup == 0, "fp8 amax of ", n, " elements: a multiple of 8 expected");
  CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  const int64_t groups = n / kGroup;
  if (groups == 0) return;
  const int64_t blocks = std::min<int64_t>((groups + kThreads - 1) / kThreads, 1024);
  amax_kernel<Source><<<unsigned(blocks), kThreads, 0, stream>>>(amax, x, groups);
  CUDA_CHECK_LAUNCH();
}

void check_four_bit(int64_t n, const char* what) {
  FRUGAL_CHECK(n % kFourBitBlock == 0, what, " of ", n, " values: a multiple of ", kFourBitBlock,
               " expected");
}

}  // namespace

void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* x, int64_t rows,
                        int64_t cols, Fp8Format format, const Fp8CastState& state,
                        cudaStream_t stream) {
  FRUGAL_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "fp8 cast: x must be 16-byte aligned");
  cast_transpose(out, out_t, Bf16Rows{x}, rows, cols, format, state, stream);
}

void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, const Nf4Device& w, int64_t rows,
                        int64_t cols, Fp8Format format, const Fp8CastState& state,
                        cudaStream_t stream) {
  check_four_bit(rows * cols, "fp8 cast of an nf4 weight");
  cast_transpose(out, out_t, Nf4Rows{w, nf4_tables(w.nf4_table, w.absmax_map)}, rows, cols, format,
                 state, stream);
}

void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, const HqqDevice& w, int64_t rows,
                        int64_t cols, Fp8Format format, const Fp8CastState& state,
                        cudaStream_t stream) {
  check_four_bit(rows * cols, "fp8 cast of an hqq weight");
  cast_transpose(out, out_t, HqqRows{w}, rows, cols, format, state, stream);
}

void fp8_amax(float* amax, const __nv_bfloat16* x, int64_t n, cudaStream_t stream) {
  FRUGAL_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "fp8 amax: x must be 16-byte aligned");
  amax_of(amax, Bf16Rows{x}, n, stream);
}

void fp8_amax(float* amax, const Nf4Device& w, int64_t n, cudaStream_t stream) {
  check_four_bit(n, "fp8 amax of an nf4 weight");
  amax_of(amax, Nf4Rows{w, nf4_tables(w.nf4_table, w.absmax_map)}, n, stream);
}

void fp8_amax(float* amax, const HqqDevice& w, int64_t n, cudaStream_t stream) {
  check_four_bit(n, "fp8 amax of an hqq weight");
  amax_of(amax, HqqRows{w}, n, stream);
}

void fp8_delayed_update(float* history, float* scale, float* scale_inv, const float* max_values,
                        int64_t history_len, int64_t slots, int margin, cudaStream_t stream) {
  if (slots == 0) return;
  const int threads = 128;
  delayed_update_kernel<<<unsigned((slots + threads - 1) / threads), threads, 0, stream>>>(
      history, scale, scale_inv, max_values, history_len, slots, margin);
  CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::cuda
