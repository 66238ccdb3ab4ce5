// Causal (optionally sliding-window) GQA attention on Hopper (sm_90a), FlashAttention-3 style,
// head dims 64 and 128: the same contract and results as flash_attention.cu, on wgmma and the
// TMA copy engine. Under a sliding window, key tiles (forward, dQ) and query tiles (dK/dV)
// wholly outside it are never loaded, as in flash_attention.cu: O(S * window) work.
//
// Block shape: 3 warpgroups of 128 threads. Warpgroup 0 is the producer: one thread issues
// every tile load (cp.async.bulk.tensor, completing on an mbarrier) into a ring of kStages
// shared-memory stages; it gives its registers away (setmaxnreg.dec) to warpgroups 1 and 2,
// the consumers, which each own 64 rows of every product and run wgmma on the tiles, then
// hand the stage back through an "empty" mbarrier. Loads of later tiles thus overlap the math
// of this one without any __syncthreads in the loop.
//
// Shared-memory tiles: rows of D bf16, stored as D / 64 column blocks of rows x 128 bytes,
// each with the 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8)). TMA writes that
// layout (box of 64 columns x rows, CU_TENSOR_MAP_SWIZZLE_128B) and wgmma reads it through
// matrix descriptors; both apply the swizzle to address bits, so every tile starts on a
// 1024-byte boundary (8 rows x 128 bytes, one swizzle period).
//  - As a "K-major" operand (the contraction index along the row: Q, K in S = Q K^T) a k-step
//    of 16 columns is the start address + 32 bytes within a column block; SBO = 1024 bytes
//    between 8-row groups; LBO unused (PTX ISA, "matrix descriptor": swizzled K-major).
//  - As an "MN-major" B operand (the contraction index down the rows: V in O = P V, with
//    imm-trans-b = 1) a k-step of 16 rows is the start address + 2048 bytes; SBO = 1024 bytes
//    between 8-row groups along k, LBO = the distance between the 64-column blocks along n.
// Accumulators of m64nNk16 are, per warp, the m16n8 layout of mma.sync repeated N / 8 times
// (value 4 j + e: row lane / 4 + 8 (e / 2), column 8 j + 2 (lane % 4) + e % 2), which is also
// the register A operand's layout, so P and dS go to the next product in registers.
//
// The global tensors are described to TMA as 4-d [batch][len][heads][D] with box
// [1][rows][1][64]: rows past len (the tail of a sequence) come back as zeros, never the next
// sequence's, and need no mask where zeros are harmless.
//
// Forward: one block per (128 query rows, head, batch), longest rows first. Each consumer
// holds O (64 rows x D, fp32) in registers; per key tile of 128: S = Q K^T (wgmma, both from
// shared memory), mask (only tiles crossing the diagonal or kv_len), online softmax in fp32
// (exp2, scale folded in), O += P V with P in registers as bf16. S of the next tile is issued
// before P V of this one, so the softmax of one tile overlaps the tensor cores' P V of the one
// before (FlashAttention-3's intra-warpgroup pipelining); the two consumers interleave too.
//
// Backward, deterministic like flash_attention.cu (no float atomics; every gradient element is
// summed by one thread in a fixed order), recomputing P = exp2(S scale log2(e) - lse_log2):
//  1. prepare (flash_attention_backward_prepare): lse_log2 and Delta = rowsum(dO O).
//  2. dK/dV: one block per (128 keys, kv head, batch); each consumer owns 64 keys and
//     computes S^T = K Q^T and dP^T = V dO^T, so P^T and dS^T are register A operands of
//     dV += P^T dO and dK += dS^T Q. The block walks the 64-row query tiles of every head of
//     its group (GQA sums in registers). The producer warp also stages each tile's lse_log2
//     and Delta in shared memory.
//  3. dQ: one block per (128 query rows, head, batch) like the forward: S, dP, dS again per
//     key tile of 64, dQ += dS K. Recomputing S and dP costs 2 of 7 products; the alternative,
//     fp32 atomics on dQ from the dK/dV blocks (FlashAttention-3's choice), would make dQ's sum
//     order, and so the training run, nondeterministic.
//
// Only the sm_90a device pass compiles the kernel bodies; other architectures get empty
// kernels that flash_attention_sm90_supports never lets run.
#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes from the runtime)
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/cuda/flash_attention_sm90.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FRUGAL_SM90_DEVICE_CODE 0  // a device pass for another architecture: empty kernels
#else
#define FRUGAL_SM90_DEVICE_CODE 1
#endif

namespace frugal::cuda {

namespace {

using namespace flash;
using bf16 = __nv_bfloat16;
using ::frugal::cpu::AttentionShape;

constexpr int kWarpgroupThreads = 128;
constexpr int kThreads = 3 * kWarpgroupThreads;  // producer + 2 consumers
constexpr int kRowsPerConsumer = 64;             // the M of every wgmma
constexpr int kSwizzleBytes = 128;               // one swizzled row of a column block: 64 bf16
constexpr int kSwizzleColumns = kSwizzleBytes / 2;
constexpr int kSwizzlePeriodBytes = 8 * kSwizzleBytes;

// Bytes of a tile of `rows` rows of D bf16.
constexpr int tile_bytes(int rows, int d) { return rows * d * 2; }

#if FRUGAL_SM90_DEVICE_CODE

constexpr int kConsumerThreads = 2 * kWarpgroupThreads;
// Bytes of one 64-column block of a tile of `rows` rows.
constexpr int column_block_bytes(int rows) { return rows * kSwizzleBytes; }
// Registers per thread after setmaxnreg: 128 x 24 + 256 x 240 = 64,512 of the 65,536.
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;

// ---- PTX wrappers -----------------------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes the initialized barriers visible to the other threads and to the copy engine (the
// async proxy) before anyone uses them; a __syncthreads must follow.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// One arrival that also announces `bytes` of copies that will complete on this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// One arrival (release: this thread's earlier shared-memory writes and reads are ordered).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase with this parity has completed (a fresh barrier counts its phase
// "-1", parity 1, as completed: the producer's first pass over the stages does not wait).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// The dynamic shared memory from its first 1024-byte boundary (one swizzle period): TMA's
// 128-byte swizzle and wgmma's descriptors both act on address bits.
__device__ __forceinline__ uint32_t swizzle_aligned(const unsigned char* smem_raw) {
  return (smem_address(smem_raw) + kSwizzlePeriodBytes - 1) &
         ~static_cast<uint32_t>(kSwizzlePeriodBytes - 1);
}

// A block's mbarriers, 8 bytes each from `once`: one for the tiles it loads once, then per
// pipeline stage a "full" one (the stage's tiles have landed) and an "empty" one (every
// consumer thread is done with them).
template <int kStages>
struct StageBarriers {
  uint32_t once;
  __device__ uint32_t full(int stage) const { return once + 8 * (1 + stage); }
  __device__ uint32_t empty(int stage) const { return once + 8 * (1 + kStages + stage); }
  // Thread 0 initialises them (`full_arrivals` arrivals complete a stage), then the block syncs.
  __device__ void init(uint32_t full_arrivals) const {
    if (threadIdx.x == 0) {
      mbarrier_init(once, 1);
      for (int stage = 0; stage < kStages; ++stage) {
        mbarrier_init(full(stage), full_arrivals);
        mbarrier_init(empty(stage), kConsumerThreads);
      }
      mbarrier_init_fence();
    }
    __syncthreads();
  }
};

// TMA: the box at coordinates (column, head, row, batch) of `map` into shared memory at dst,
// completing `bar`'s transaction count by the box's bytes (out-of-range elements are zeros).
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                              int column, int head, int row, int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(head), "r"(row), "r"(batch), "r"(bar)
      : "memory");
}

// All D / 64 column blocks of rows [row, row + kRows) of one head into a tile at dst.
template <int D, int kRows>
__device__ __forceinline__ void tma_load_rows(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                              int head, int row, int batch) {
#pragma unroll
  for (int block = 0; block < D / kSwizzleColumns; ++block)
    tma_load_tile(dst + block * column_block_bytes(kRows), map, bar, block * kSwizzleColumns, head,
                  row, batch);
}

// The producer thread's loop of the forward and dQ kernels: key tile t (keys from
// key0 + t * kBlockN) of kv head g goes into stage t % kStages once the consumers have freed
// it, K at k_tile(stage), V at v_tile(stage).
template <int D, int kBlockN, int kStages, class KTile, class VTile>
__device__ __forceinline__ void load_kv_tiles(const StageBarriers<kStages>& bars, KTile k_tile,
                                              VTile v_tile, uint32_t stage_bytes,
                                              const CUtensorMap* k_map, const CUtensorMap* v_map,
                                              int g, int b, int key0, int n_tiles) {
  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t % kStages;
    mbarrier_wait(bars.empty(stage), ((t / kStages) & 1) ^ 1);
    mbarrier_arrive_expect_bytes(bars.full(stage), stage_bytes);
    tma_load_rows<D, kBlockN>(k_tile(stage), k_map, bars.full(stage), g, key0 + t * kBlockN, b);
    tma_load_rows<D, kBlockN>(v_tile(stage), v_map, bars.full(stage), g, key0 + t * kBlockN, b);
  }
}

template <int kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// wgmma ordering: fence before the first wgmma that reads registers written by ordinary
// instructions (accumulators, register A operands); commit closes a group of issued wgmmas;
// wait<N> blocks until at most N groups are in flight.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Pins the registers of an accumulator array at this point of the program: the compiler may
// not move their reads or writes across it, so none slips between a wgmma and its wait.
template <int N>
__device__ __forceinline__ void pin_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin_registers(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

// A wgmma shared-memory matrix descriptor (PTX ISA, "matrix descriptor format"): start address,
// leading and stride byte offsets (all >> 4, 14 bits each), base offset 0 (tiles are
// 1024-byte aligned), layout type 1 in bits 62-63 = 128-byte swizzle.
__device__ __forceinline__ uint64_t matrix_descriptor(uint32_t address, uint32_t leading_bytes,
                                                      uint32_t stride_bytes) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32 | uint64_t{1} << 62;
}

// K-major operand: rows [row0, row0 + 8 m) of a tile of kRows rows, contraction columns
// [16 kk, 16 kk + 16).
template <int kRows>
__device__ __forceinline__ uint64_t k_major(uint32_t tile, int row0, int kk) {
  const uint32_t address =
      tile + (kk / 4) * column_block_bytes(kRows) + row0 * kSwizzleBytes + (kk % 4) * 32;
  return matrix_descriptor(address, 16, kSwizzlePeriodBytes);
}
// MN-major B operand: contraction rows [16 kk, 16 kk + 16) of a tile of kRows rows, all its
// columns as n.
template <int kRows>
__device__ __forceinline__ uint64_t mn_major(uint32_t tile, int kk) {
  return matrix_descriptor(tile + kk * 16 * kSwizzleBytes, column_block_bytes(kRows),
                           kSwizzlePeriodBytes);
}

// wgmma m64nNk16, bf16 inputs, fp32 accumulators d (N / 2 per thread). _ss: A and B from
// shared memory, both K-major. _rs: A from registers (the m64k16 fragment), B MN-major
// (imm-trans-b = 1). accumulate false: d = A B.
__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[32], uint64_t a, uint64_t b,
                                                bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(int(accumulate)));
}

__device__ __forceinline__ void wgmma_m64n64_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                                bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
}

__device__ __forceinline__ void wgmma_m64n128_ss(float (&d)[64], uint64_t a, uint64_t b,
                                                 bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b), "r"(int(accumulate)));
}

__device__ __forceinline__ void wgmma_m64n128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                                 bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
}

template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b,
                                         bool accumulate) {
  if constexpr (N == 64)
    wgmma_m64n64_ss(d, a, b, accumulate);
  else
    wgmma_m64n128_ss(d, a, b, accumulate);
}
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (N == 64)
    wgmma_m64n64_rs(d, a, b, true);
  else
    wgmma_m64n128_rs(d, a, b, true);
}

// Accumulator columns [16 kk, 16 kk + 16) (values 8 kk .. 8 kk + 7) as register A operands.
template <int N>
__device__ __forceinline__ void accumulators_to_a(uint32_t (&a)[N / 16][4],
                                                  const float (&d)[N / 2]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    a[kk][0] = pack_bf16(d[8 * kk + 0], d[8 * kk + 1]);
    a[kk][1] = pack_bf16(d[8 * kk + 2], d[8 * kk + 3]);
    a[kk][2] = pack_bf16(d[8 * kk + 4], d[8 * kk + 5]);
    a[kk][3] = pack_bf16(d[8 * kk + 6], d[8 * kk + 7]);
  }
}

// The two kinds of product every kernel here issues, each closed as one commit group (the
// caller fences before them and waits after).
// acc = A B^T over the head dim: rows [a_row0, a_row0 + 64) of the K-major tile a (kRowsA rows)
// against all kN rows of the K-major tile b.
template <int D, int kRowsA, int kN>
__device__ __forceinline__ void issue_product_ss(float (&acc)[kN / 2], uint32_t a, int a_row0,
                                                 uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss<kN>(acc, k_major<kRowsA>(a, a_row0, kk), k_major<kN>(b, 0, kk), kk > 0);
  wgmma_commit();
}
// acc += A B: A in registers (kK / 16 fragments of 16 contraction columns), B the MN-major tile
// b of kK rows and D columns.
template <int D, int kK>
__device__ __forceinline__ void issue_product_rs(float (&acc)[D / 2],
                                                 const uint32_t (&a)[kK / 16][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) wgmma_rs<D>(acc, a[kk], mn_major<kK>(b, kk));
  wgmma_commit();
}

#endif  // FRUGAL_SM90_DEVICE_CODE

// ---- forward ---------------------------------------------------------------------------------

constexpr int kFwdBlockM = 2 * kRowsPerConsumer, kFwdBlockN = 128;

// Shared memory of the forward, as byte offsets from a 1024-byte aligned base: Q, then kStages
// (K, V) stages, then the barriers (Q loaded; per stage full and empty).
template <int D, int kStages>
struct ForwardSmem {
  static constexpr int kQ = 0;
  static constexpr int kKv = kQ + tile_bytes(kFwdBlockM, D);
  static constexpr int kTileBytes = tile_bytes(kFwdBlockN, D);
  static constexpr int kStageBytes = 2 * kTileBytes;  // K then V
  static constexpr int kBarriers = kKv + kStages * kStageBytes;
  static constexpr int kBytes = kBarriers + 8 * (1 + 2 * kStages);
  static constexpr int kLaunchBytes = kBytes + kSwizzlePeriodBytes;  // slack to align the base
};

template <int D, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    flash_sm90_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                              const __grid_constant__ CUtensorMap q_map,
                              const __grid_constant__ CUtensorMap k_map,
                              const __grid_constant__ CUtensorMap v_map, const Params p) {
#if FRUGAL_SM90_DEVICE_CODE
  using Smem = ForwardSmem<D, kStages>;
  constexpr int kBlockM = kFwdBlockM, kBlockN = kFwdBlockN;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = swizzle_aligned(smem_raw);
  const int b = blockIdx.x / p.n_heads, h = blockIdx.x % p.n_heads, g = h / p.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;  // the longest rows are launched first
  bf16* out_head = out + static_cast<int64_t>(b) * p.q_len * p.q_stride + h * D;
  float* lse_head = lse + (static_cast<int64_t>(b) * p.n_heads + h) * p.q_len;

  // Keys [kv_begin, kv_end) are seen by some row of the block (kv_begin > 0 only under a
  // sliding window): only those tiles are loaded.
  const int last_row = min(q0 + kBlockM, p.q_len) - 1;
  const int kv_end = keys_seen(last_row, p);
  const int kv_begin = first_key_seen(q0, p) / kBlockN * kBlockN;
  const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kBlockN - 1) / kBlockN : 0;
  if (n_tiles == 0) {  // no row of the block sees a key
    write_unseen_rows<D, kBlockM, kThreads>(out_head, lse_head, q0, p);
    return;
  }

  const uint32_t sq = base + Smem::kQ, q_full = base + Smem::kBarriers;
  const StageBarriers<kStages> bars{q_full};
  auto k_tile = [&](int stage) { return base + Smem::kKv + stage * Smem::kStageBytes; };
  auto v_tile = [&](int stage) { return k_tile(stage) + Smem::kTileBytes; };
  bars.init(1);

  if (threadIdx.x < kWarpgroupThreads) {  // producer
    registers_decrease<kProducerRegisters>();
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_bytes(q_full, tile_bytes(kBlockM, D));
      tma_load_rows<D, kBlockM>(sq, &q_map, q_full, h, q0, b);
      load_kv_tiles<D, kBlockN>(bars, k_tile, v_tile, Smem::kStageBytes, &k_map, &v_map, g, b,
                                kv_begin, n_tiles);
    }
    return;
  }

  // Consumers: warpgroup c owns query rows [q0 + 64 c, q0 + 64 c + 64).
  registers_increase<kConsumerRegisters>();
  const int consumer = threadIdx.x / kWarpgroupThreads - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int row_a = q0 + consumer * kRowsPerConsumer + warp * 16 + lane / 4, row_b = row_a + 8;
  // Keys [unmasked_begin, unmasked_end) every row of the block sees (and that exist): tiles
  // inside need no mask.
  const int unmasked_end = min(q0 + p.causal_offset + 1, p.kv_len);
  const int unmasked_begin = first_key_seen(last_row, p);
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  // Issues S = Q K_t^T (64 rows x 128 keys per consumer) into s, once tile t has landed.
  auto issue_scores = [&](float(&s)[kBlockN / 2], int t) {
    const int stage = t % kStages;
    mbarrier_wait(bars.full(stage), (t / kStages) & 1);
    wgmma_fence();
    issue_product_ss<D, kBlockM, kBlockN>(s, sq, consumer * kRowsPerConsumer, k_tile(stage));
  };
  // Online softmax of tile t, rows in fp32 (a row's 128 scores are spread over the 4 lanes of a
  // quad): masks s, updates the row max and sum, turns s into P (relative to the new max) and
  // returns the factor that takes O from the old max to the new one.
  auto softmax = [&](float(&s)[kBlockN / 2], int t, float(&correction)[2]) {
    const int k0 = kv_begin + t * kBlockN;
    if (k0 + kBlockN > unmasked_end || k0 < unmasked_begin) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        const int key = k0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
        const int row = (i % 4) < 2 ? row_a : row_b;
        if (hidden_key(row, key, p)) s[i] = -INFINITY;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
        mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row that has seen no key yet keeps max -inf; subtracting 0 keeps exp2(-inf) = 0.
      const float base_log2 = mx == -INFINITY ? 0.0f : mx * p.scale_log2;
      correction[r] = exp2_approx(row_max[r] * p.scale_log2 - base_log2);
      row_max[r] = mx;
      row_sum[r] *= correction[r];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = exp2_approx(fmaf(s[4 * j + 2 * r + e], p.scale_log2, -base_log2));
          s[4 * j + 2 * r + e] = pe;
          row_sum[r] += pe;
        }
      }
    }
  };

  // FlashAttention-3's overlap within a warpgroup: S_{t+1} is issued before O += P_t V_t, and
  // its softmax runs while the tensor cores still work on P_t V_t. P_t (pa, bf16) and O stay
  // untouched until that product has completed; s is free for S_{t+1} once P_t is in pa.
  mbarrier_wait(q_full, 0);
  float s[kBlockN / 2], correction[2];
  uint32_t pa[kBlockN / 16][4];
  issue_scores(s, 0);
  wgmma_wait<0>();
  pin_registers(s);
  softmax(s, 0, correction);  // O is still 0: nothing to rescale
  accumulators_to_a<kBlockN>(pa, s);
  // O += P_t V_t (issued, not waited for).
  auto issue_pv = [&](int t) {
    wgmma_fence();
    pin_registers(o);
    pin_registers(pa);
    issue_product_rs<D, kBlockN>(o, pa, v_tile(t % kStages));
  };
  // Every tile but the last: two products in flight, then the softmax of the later one. The
  // last tile is peeled off rather than guarded by a branch, so that the groups in flight are
  // the same on every path (ptxas otherwise serializes every wgmma, warning C7514).
  for (int t = 0; t + 1 < n_tiles; ++t) {
    issue_scores(s, t + 1);
    issue_pv(t);
    wgmma_wait<1>();  // S_{t+1} has completed; P_t V_t may still be running
    pin_registers(s);
    softmax(s, t + 1, correction);
    wgmma_wait<0>();
    pin_registers(o);
    pin_registers(pa);
    mbarrier_arrive(bars.empty(t % kStages));  // K_t (read by S_t) and V_t are done with
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        o[4 * j + 2 * r] *= correction[r];
        o[4 * j + 2 * r + 1] *= correction[r];
      }
    }
    accumulators_to_a<kBlockN>(pa, s);
  }
  issue_pv(n_tiles - 1);
  wgmma_wait<0>();
  pin_registers(o);
  mbarrier_arrive(bars.empty((n_tiles - 1) % kStages));

  write_output_rows<D>(out_head, lse_head, row_a, lane, row_sum, row_max, p,
                       [&](int j, int r, int e) { return o[4 * j + 2 * r + e]; });
#endif
}

// ---- backward: dK and dV ---------------------------------------------------------------------

constexpr int kDkdvBlockN = 2 * kRowsPerConsumer;  // keys per block, 64 per consumer
constexpr int kDkdvBlockM = 64;                    // query rows per step

// K, V, then kStages (Q, dO) stages, then per stage 64 lse_log2 and 64 Delta values, then the
// barriers (K and V loaded; per stage full and empty).
template <int D, int kStages>
struct DkdvSmem {
  static constexpr int kK = 0;
  static constexpr int kV = kK + tile_bytes(kDkdvBlockN, D);
  static constexpr int kQdo = kV + tile_bytes(kDkdvBlockN, D);
  static constexpr int kTileBytes = tile_bytes(kDkdvBlockM, D);
  static constexpr int kStageBytes = 2 * kTileBytes;  // Q then dO
  static constexpr int kRowValues = kQdo + kStages * kStageBytes;
  static constexpr int kRowValueBytes = 2 * kDkdvBlockM * 4;  // lse_log2 then Delta
  static constexpr int kBarriers = kRowValues + kStages * kRowValueBytes;
  static constexpr int kBytes = kBarriers + 8 * (1 + 2 * kStages);
  static constexpr int kLaunchBytes = kBytes + kSwizzlePeriodBytes;
};

template <int D, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    flash_sm90_backward_dkdv_kernel(float* __restrict__ dk, float* __restrict__ dv,
                                    const __grid_constant__ CUtensorMap q_map,
                                    const __grid_constant__ CUtensorMap k_map,
                                    const __grid_constant__ CUtensorMap v_map,
                                    const __grid_constant__ CUtensorMap dout_map,
                                    const float* __restrict__ lse_log2,
                                    const float* __restrict__ delta, const Params p) {
#if FRUGAL_SM90_DEVICE_CODE
  using Smem = DkdvSmem<D, kStages>;
  constexpr int kBlockM = kDkdvBlockM, kBlockN = kDkdvBlockN;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = swizzle_aligned(smem_raw);
  unsigned char* smem = smem_raw + (base - smem_address(smem_raw));
  const int b = blockIdx.x / p.n_kv_heads, g = blockIdx.x % p.n_kv_heads;
  const int j0 = blockIdx.y * kBlockN;  // the first key tiles see the most rows: launched first
  // Row i sees key j0 iff j0 <= i + offset: earlier rows see none of this block's keys. Under
  // a sliding window, rows from i_end on are window or more past the block's last key.
  const int i_start = min(max(j0 - p.causal_offset, 0), p.q_len);
  const int last_key = min(j0 + kBlockN, p.kv_len) - 1;
  const int i_end =
      p.window > 0 ? min(max(last_key - p.causal_offset + p.window, 0), p.q_len) : p.q_len;
  const int n_q_tiles = i_end > i_start ? (i_end - i_start + kBlockM - 1) / kBlockM : 0;
  const int n_steps = p.group * n_q_tiles;
  if (n_steps == 0) return;  // adds nothing

  const uint32_t sk = base + Smem::kK, sv = base + Smem::kV, kv_full = base + Smem::kBarriers;
  const StageBarriers<kStages> bars{kv_full};
  auto q_tile = [&](int stage) { return base + Smem::kQdo + stage * Smem::kStageBytes; };
  auto dout_tile = [&](int stage) { return q_tile(stage) + Smem::kTileBytes; };
  auto row_lse = [&](int stage) {
    return reinterpret_cast<float*>(smem + Smem::kRowValues + stage * Smem::kRowValueBytes);
  };
  auto row_delta = [&](int stage) { return row_lse(stage) + kBlockM; };
  auto step_head = [&](int step) { return g * p.group + step / n_q_tiles; };
  auto step_row0 = [&](int step) { return i_start + (step % n_q_tiles) * kBlockM; };
  // A stage is full when the producer warp's 32 lanes arrive (lane 0 with the bytes).
  bars.init(32);

  if (threadIdx.x < kWarpgroupThreads) {  // producer: its first warp
    registers_decrease<kProducerRegisters>();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      if (lane == 0) {
        mbarrier_arrive_expect_bytes(kv_full, 2 * tile_bytes(kBlockN, D));
        tma_load_rows<D, kBlockN>(sk, &k_map, kv_full, g, j0, b);
        tma_load_rows<D, kBlockN>(sv, &v_map, kv_full, g, j0, b);
      }
      for (int step = 0; step < n_steps; ++step) {
        const int stage = step % kStages, h = step_head(step), i0 = step_row0(step);
        mbarrier_wait(bars.empty(stage), ((step / kStages) & 1) ^ 1);
        // Rows past q_len get lse_log2 = +inf and Delta = 0: P = 0, dS = 0, they add nothing.
        const int64_t row_head = (static_cast<int64_t>(b) * p.n_heads + h) * p.q_len;
        for (int r = lane; r < kBlockM; r += 32) {
          const bool valid = i0 + r < p.q_len;
          row_lse(stage)[r] = valid ? lse_log2[row_head + i0 + r] : INFINITY;
          row_delta(stage)[r] = valid ? delta[row_head + i0 + r] : 0.0f;
        }
        if (lane == 0) {
          mbarrier_arrive_expect_bytes(bars.full(stage), Smem::kStageBytes);
          tma_load_rows<D, kBlockM>(q_tile(stage), &q_map, bars.full(stage), h, i0, b);
          tma_load_rows<D, kBlockM>(dout_tile(stage), &dout_map, bars.full(stage), h, i0, b);
        } else {
          mbarrier_arrive(bars.full(stage));
        }
      }
    }
    return;
  }

  // Consumers: warpgroup c owns keys [j0 + 64 c, j0 + 64 c + 64).
  registers_increase<kConsumerRegisters>();
  const int consumer = threadIdx.x / kWarpgroupThreads - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int key_a = j0 + consumer * kRowsPerConsumer + warp * 16 + lane / 4, key_b = key_a + 8;
  float dk_acc[D / 2], dv_acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk_acc[i] = dv_acc[i] = 0.0f;

  mbarrier_wait(kv_full, 0);
  for (int step = 0; step < n_steps; ++step) {
    const int stage = step % kStages, i0 = step_row0(step);
    mbarrier_wait(bars.full(stage), (step / kStages) & 1);

    // S^T = K Q^T and dP^T = V dO^T: 64 keys (rows) x 64 queries per consumer, as two groups
    // so that P^T is computed while the tensor cores still work on dP^T, and dS^T while they
    // work on dV.
    float st[kBlockM / 2], dpt[kBlockM / 2];
    wgmma_fence();
    issue_product_ss<D, kBlockN, kBlockM>(st, sk, consumer * kRowsPerConsumer, q_tile(stage));
    issue_product_ss<D, kBlockN, kBlockM>(dpt, sv, consumer * kRowsPerConsumer, dout_tile(stage));
    wgmma_wait<1>();  // S^T has completed
    pin_registers(st);

    // P^T = exp2(S^T scale log2(e) - lse_log2), 0 where masked; dV += P^T dO.
    const float* lse_t = row_lse(stage);
    const float* delta_t = row_delta(stage);
    // Masks where a key is after a row, or (window) the farthest pair is window or more apart.
    const bool need_mask = j0 + kBlockN - 1 > i0 + p.causal_offset ||
                           (p.window > 0 && i0 + kBlockM - 1 + p.causal_offset - j0 >= p.window);
#pragma unroll
    for (int i = 0; i < kBlockM / 2; ++i) {
      const int col = (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
      const int key = (i % 4) < 2 ? key_a : key_b;
      float pe = exp2_approx(fmaf(st[i], p.scale_log2, -lse_t[col]));
      const int behind = i0 + col + p.causal_offset - key;
      if (need_mask && (behind < 0 || (p.window > 0 && behind >= p.window))) pe = 0.0f;
      st[i] = pe;
    }
    uint32_t pa[kBlockM / 16][4], dsa[kBlockM / 16][4];
    accumulators_to_a<kBlockM>(pa, st);
    wgmma_fence();
    pin_registers(dv_acc);
    pin_registers(pa);
    issue_product_rs<D, kBlockM>(dv_acc, pa, dout_tile(stage));
    wgmma_wait<1>();  // dP^T has completed; dV may still be running
    pin_registers(dpt);

    // dS^T = P^T (dP^T - Delta); dK += dS^T Q (the scale is applied once at the end).
#pragma unroll
    for (int i = 0; i < kBlockM / 2; ++i) {
      const int col = (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
      dpt[i] = st[i] * (dpt[i] - delta_t[col]);
    }
    accumulators_to_a<kBlockM>(dsa, dpt);
    wgmma_fence();
    pin_registers(dk_acc);
    pin_registers(dsa);
    issue_product_rs<D, kBlockM>(dk_acc, dsa, q_tile(stage));
    wgmma_wait<0>();
    pin_registers(dk_acc);
    pin_registers(dv_acc);
    pin_registers(pa);  // the registers of A operands are read until the wgmma completes
    pin_registers(dsa);
    mbarrier_arrive(bars.empty(stage));
  }

  const int64_t kv_head = static_cast<int64_t>(b) * p.kv_len * p.kv_stride + g * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = r == 0 ? key_a : key_b;
    if (key >= p.kv_len) continue;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int64_t at = kv_head + key * p.kv_stride + j * 8 + (lane % 4) * 2;
      float2* dk2 = reinterpret_cast<float2*>(dk + at);
      float2* dv2 = reinterpret_cast<float2*>(dv + at);
      float2 x = *dk2;
      x.x += p.scale * dk_acc[4 * j + 2 * r];
      x.y += p.scale * dk_acc[4 * j + 2 * r + 1];
      *dk2 = x;
      x = *dv2;
      x.x += dv_acc[4 * j + 2 * r];
      x.y += dv_acc[4 * j + 2 * r + 1];
      *dv2 = x;
    }
  }
#endif
}

// ---- backward: dQ ----------------------------------------------------------------------------

constexpr int kDqBlockM = 2 * kRowsPerConsumer, kDqBlockN = 64;

// Q, dO, then kStages (K, V) stages of 64 keys, then the barriers (Q and dO loaded; per stage
// full and empty).
template <int D, int kStages>
struct DqSmem {
  static constexpr int kQ = 0;
  static constexpr int kDout = kQ + tile_bytes(kDqBlockM, D);
  static constexpr int kKv = kDout + tile_bytes(kDqBlockM, D);
  static constexpr int kTileBytes = tile_bytes(kDqBlockN, D);
  static constexpr int kStageBytes = 2 * kTileBytes;  // K then V
  static constexpr int kBarriers = kKv + kStages * kStageBytes;
  static constexpr int kBytes = kBarriers + 8 * (1 + 2 * kStages);
  static constexpr int kLaunchBytes = kBytes + kSwizzlePeriodBytes;
};

template <int D, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    flash_sm90_backward_dq_kernel(float* __restrict__ dq, const __grid_constant__ CUtensorMap q_map,
                                  const __grid_constant__ CUtensorMap k_map,
                                  const __grid_constant__ CUtensorMap v_map,
                                  const __grid_constant__ CUtensorMap dout_map,
                                  const float* __restrict__ lse_log2,
                                  const float* __restrict__ delta, const Params p) {
#if FRUGAL_SM90_DEVICE_CODE
  using Smem = DqSmem<D, kStages>;
  constexpr int kBlockM = kDqBlockM, kBlockN = kDqBlockN;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = swizzle_aligned(smem_raw);
  const int b = blockIdx.x / p.n_heads, h = blockIdx.x % p.n_heads, g = h / p.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;
  const int last_row = min(q0 + kBlockM, p.q_len) - 1;
  const int kv_end = keys_seen(last_row, p);
  const int kv_begin = first_key_seen(q0, p) / kBlockN * kBlockN;
  const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kBlockN - 1) / kBlockN : 0;
  if (n_tiles == 0) return;  // adds nothing

  const uint32_t sq = base + Smem::kQ, sdo = base + Smem::kDout, qdo_full = base + Smem::kBarriers;
  const StageBarriers<kStages> bars{qdo_full};
  auto k_tile = [&](int stage) { return base + Smem::kKv + stage * Smem::kStageBytes; };
  auto v_tile = [&](int stage) { return k_tile(stage) + Smem::kTileBytes; };
  bars.init(1);

  if (threadIdx.x < kWarpgroupThreads) {  // producer
    registers_decrease<kProducerRegisters>();
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_bytes(qdo_full, 2 * tile_bytes(kBlockM, D));
      tma_load_rows<D, kBlockM>(sq, &q_map, qdo_full, h, q0, b);
      tma_load_rows<D, kBlockM>(sdo, &dout_map, qdo_full, h, q0, b);
      load_kv_tiles<D, kBlockN>(bars, k_tile, v_tile, Smem::kStageBytes, &k_map, &v_map, g, b,
                                kv_begin, n_tiles);
    }
    return;
  }

  registers_increase<kConsumerRegisters>();
  const int consumer = threadIdx.x / kWarpgroupThreads - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int row_a = q0 + consumer * kRowsPerConsumer + warp * 16 + lane / 4, row_b = row_a + 8;
  const int64_t row_head = (static_cast<int64_t>(b) * p.n_heads + h) * p.q_len;
  // Rows past q_len: lse_log2 = +inf, Delta = 0, so P = dS = 0 (and they are not stored).
  const float lse_a = row_a < p.q_len ? lse_log2[row_head + row_a] : INFINITY;
  const float lse_b = row_b < p.q_len ? lse_log2[row_head + row_b] : INFINITY;
  const float delta_a = row_a < p.q_len ? delta[row_head + row_a] : 0.0f;
  const float delta_b = row_b < p.q_len ? delta[row_head + row_b] : 0.0f;
  const int unmasked_end = min(q0 + p.causal_offset + 1, p.kv_len);
  const int unmasked_begin = first_key_seen(last_row, p);
  float dq_acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq_acc[i] = 0.0f;

  mbarrier_wait(qdo_full, 0);
  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t % kStages;
    mbarrier_wait(bars.full(stage), (t / kStages) & 1);

    // S = Q K^T and dP = dO V^T: 64 rows x 64 keys per consumer, as two groups so that P is
    // computed while the tensor cores still work on dP.
    float s[kBlockN / 2], dp[kBlockN / 2];
    wgmma_fence();
    issue_product_ss<D, kBlockM, kBlockN>(s, sq, consumer * kRowsPerConsumer, k_tile(stage));
    issue_product_ss<D, kBlockM, kBlockN>(dp, sdo, consumer * kRowsPerConsumer, v_tile(stage));
    wgmma_wait<1>();  // S has completed
    pin_registers(s);

    const int k0 = kv_begin + t * kBlockN;
    const bool need_mask = k0 + kBlockN > unmasked_end || k0 < unmasked_begin;
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) {
      const int key = k0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
      const bool upper = (i % 4) < 2;
      const int row = upper ? row_a : row_b;
      float pe = exp2_approx(fmaf(s[i], p.scale_log2, -(upper ? lse_a : lse_b)));
      if (need_mask && hidden_key(row, key, p)) pe = 0.0f;
      s[i] = pe;
    }
    wgmma_wait<0>();  // dP has completed
    pin_registers(dp);
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i)
      dp[i] = s[i] * (dp[i] - ((i % 4) < 2 ? delta_a : delta_b));

    // dQ += dS K.
    uint32_t dsa[kBlockN / 16][4];
    accumulators_to_a<kBlockN>(dsa, dp);
    wgmma_fence();
    pin_registers(dq_acc);
    pin_registers(dsa);
    issue_product_rs<D, kBlockN>(dq_acc, dsa, k_tile(stage));
    wgmma_wait<0>();
    pin_registers(dq_acc);
    pin_registers(dsa);  // the registers of A operands are read until the wgmma completes
    mbarrier_arrive(bars.empty(stage));
  }

  const int64_t q_head = static_cast<int64_t>(b) * p.q_len * p.q_stride + h * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row_a : row_b;
    if (row >= p.q_len) continue;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      float2* dq2 =
          reinterpret_cast<float2*>(dq + q_head + row * p.q_stride + j * 8 + (lane % 4) * 2);
      float2 x = *dq2;
      x.x += p.scale * dq_acc[4 * j + 2 * r];
      x.y += p.scale * dq_acc[4 * j + 2 * r + 1];
      *dq2 = x;
    }
  }
#endif
}

// ---- launchers -------------------------------------------------------------------------------

// cuTensorMapEncodeTiled is a driver function; asking the runtime for it keeps the build free of
// -lcuda. Looked up once: the pointer stays valid for the life of the process.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || fn == nullptr)
      fail("cuda flash attention sm90: the driver does not export cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A [batch][len][heads][head_dim] bf16 tensor for TMA, loaded in boxes of box_rows rows x 64
// columns of one head, 128-byte swizzled; elements outside the tensor read as zeros.
CUtensorMap tensor_map(const bf16* data, int64_t batch, int64_t len, int64_t heads,
                       int64_t head_dim, int box_rows) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(len), static_cast<cuuint64_t>(batch)};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(heads * head_dim * 2);
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(head_dim * 2), row_bytes,
                                 row_bytes * static_cast<cuuint64_t>(len)};  // of dims 1, 2, 3
  const cuuint32_t box[4] = {kSwizzleColumns, 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult status = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<bf16*>(data), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    fail("cuda flash attention sm90: cuTensorMapEncodeTiled failed (CUresult ", int(status),
         ") for batch ", batch, " len ", len, " heads ", heads, " head_dim ", head_dim);
  return map;
}

// Stages: as many as the 227 KiB of shared memory per block take with room to spare.
template <int D>
constexpr int kForwardStages = D == 128 ? 3 : 4;
template <int D>
constexpr int kDkdvStages = D == 128 ? 2 : 3;
constexpr int kDqStages = 3;

template <int D>
void forward_for(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                 const AttentionShape& s, cudaStream_t stream) {
  constexpr int kStages = kForwardStages<D>;
  constexpr int smem = ForwardSmem<D, kStages>::kLaunchBytes;
  static_assert(smem <= 227 * 1024, "forward tiles exceed shared memory");
  const auto kernel = flash_sm90_forward_kernel<D, kStages>;
  allow_shared_memory(kernel, smem);
  const CUtensorMap q_map = tensor_map(q, s.batch, s.q_len, s.n_heads, D, kFwdBlockM);
  const CUtensorMap k_map = tensor_map(k, s.batch, s.kv_len, s.n_kv_heads, D, kFwdBlockN);
  const CUtensorMap v_map = tensor_map(v, s.batch, s.kv_len, s.n_kv_heads, D, kFwdBlockN);
  const dim3 grid(static_cast<unsigned>(s.batch * s.n_heads),
                  grid_blocks(s.q_len, kFwdBlockM, "q_len"));
  kernel<<<grid, kThreads, smem, stream>>>(out, lse, q_map, k_map, v_map, make_params(s));
  CUDA_CHECK_LAUNCH();
}

template <int D>
void backward_for(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q, const bf16* k,
                  const bf16* v, const float* lse_log2, const float* delta, const AttentionShape& s,
                  cudaStream_t stream) {
  const Params p = make_params(s);
  {
    constexpr int kStages = kDkdvStages<D>;
    constexpr int smem = DkdvSmem<D, kStages>::kLaunchBytes;
    static_assert(smem <= 227 * 1024, "dK/dV tiles exceed shared memory");
    const auto kernel = flash_sm90_backward_dkdv_kernel<D, kStages>;
    allow_shared_memory(kernel, smem);
    const CUtensorMap q_map = tensor_map(q, s.batch, s.q_len, s.n_heads, D, kDkdvBlockM);
    const CUtensorMap dout_map = tensor_map(dout, s.batch, s.q_len, s.n_heads, D, kDkdvBlockM);
    const CUtensorMap k_map = tensor_map(k, s.batch, s.kv_len, s.n_kv_heads, D, kDkdvBlockN);
    const CUtensorMap v_map = tensor_map(v, s.batch, s.kv_len, s.n_kv_heads, D, kDkdvBlockN);
    const dim3 grid(static_cast<unsigned>(s.batch * s.n_kv_heads),
                    grid_blocks(s.kv_len, kDkdvBlockN, "kv_len"));
    kernel<<<grid, kThreads, smem, stream>>>(dk, dv, q_map, k_map, v_map, dout_map, lse_log2, delta,
                                             p);
    CUDA_CHECK_LAUNCH();
  }
  {
    constexpr int smem = DqSmem<D, kDqStages>::kLaunchBytes;
    static_assert(smem <= 227 * 1024, "dQ tiles exceed shared memory");
    const auto kernel = flash_sm90_backward_dq_kernel<D, kDqStages>;
    allow_shared_memory(kernel, smem);
    const CUtensorMap q_map = tensor_map(q, s.batch, s.q_len, s.n_heads, D, kDqBlockM);
    const CUtensorMap dout_map = tensor_map(dout, s.batch, s.q_len, s.n_heads, D, kDqBlockM);
    const CUtensorMap k_map = tensor_map(k, s.batch, s.kv_len, s.n_kv_heads, D, kDqBlockN);
    const CUtensorMap v_map = tensor_map(v, s.batch, s.kv_len, s.n_kv_heads, D, kDqBlockN);
    const dim3 grid(static_cast<unsigned>(s.batch * s.n_heads),
                    grid_blocks(s.q_len, kDqBlockM, "q_len"));
    kernel<<<grid, kThreads, smem, stream>>>(dq, q_map, k_map, v_map, dout_map, lse_log2, delta, p);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

bool flash_attention_sm90_supports(const AttentionShape& s,
                                   std::initializer_list<const void*> bf16_tensors,
                                   std::initializer_list<const void*> fp32_tensors) {
#if defined(FRUGAL_HAVE_SM90A_KERNELS)
  // The FlashAttention-2 kernels' conditions (head dim 64 or 128, alignment), and row indices
  // that fit the kernels' int and TMA's int32 coordinates.
  if (!flash_attention_supports(s, bf16_tensors, fp32_tensors)) return false;
  if (s.q_len > INT32_MAX / 2 || s.kv_len > INT32_MAX / 2) return false;
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;  // sm_90a code runs on exactly this
#else
  (void)s;
  (void)bf16_tensors;
  (void)fp32_tensors;
  return false;  // built without an sm_90 target
#endif
}

void flash_attention_sm90_forward(bf16* out, float* lse, const bf16* q, const bf16* k,
                                  const bf16* v, const AttentionShape& s, cudaStream_t stream) {
  if (s.batch == 0 || s.q_len == 0) return;
  // With no keys every row is out = 0, lse = -inf; TMA cannot describe an empty tensor.
  if (s.kv_len == 0) return flash_attention_forward(out, lse, q, k, v, s, stream);
  if (s.head_dim == 64)
    forward_for<64>(out, lse, q, k, v, s, stream);
  else if (s.head_dim == 128)
    forward_for<128>(out, lse, q, k, v, s, stream);
  else
    fail("cuda flash attention sm90: head_dim ", s.head_dim, " is not supported (64 or 128)");
}

void flash_attention_sm90_backward(float* dq, float* dk, float* dv, const bf16* dout, const bf16* q,
                                   const bf16* k, const bf16* v, const bf16* out, const float* lse,
                                   const AttentionShape& s, float* scratch, cudaStream_t stream) {
  if (s.batch == 0 || s.q_len == 0 || s.kv_len == 0) return;
  if (scratch == nullptr)
    fail("cuda flash attention sm90: the backward needs ",
         flash_attention_backward_scratch_floats(s), " floats of scratch, got none");
  if (s.head_dim != 64 && s.head_dim != 128)
    fail("cuda flash attention sm90: head_dim ", s.head_dim, " is not supported (64 or 128)");
  flash_attention_backward_prepare(scratch, dout, out, lse, s, stream);
  const int64_t rows = s.batch * s.n_heads * s.q_len;
  const float* lse_log2 = scratch;
  const float* delta = scratch + rows;
  if (s.head_dim == 64)
    backward_for<64>(dq, dk, dv, dout, q, k, v, lse_log2, delta, s, stream);
  else
    backward_for<128>(dq, dk, dv, dout, q, k, v, lse_log2, delta, s, stream);
}

}  // namespace frugal::cuda
