// What the Hopper attention kernels share (flash_attention_sm90.cu: the forward and the
// backward's outline; flash_attention_sm90_dkdv.cu and flash_attention_sm90_dq.cu: the
// backward's passes): the block shape, the shared-memory tile layout, the PTX instructions as
// functions, and the TMA descriptors of the global tensors.
//
// Block shape: 3 warpgroups of 128 threads (the forward at head dim 64: 4). Warpgroup 0 is the
// producer: one thread issues every tile load (cp.async.bulk.tensor, completing on an mbarrier)
// into a ring of kStages shared-memory stages; it gives its registers away (setmaxnreg.dec) to
// the other warpgroups, the consumers, which each own 64 rows of every product and run wgmma on
// the tiles, then hand the stage back through an "empty" mbarrier. Loads of later tiles thus
// overlap the math of this one without any __syncthreads in the loop.
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
// the register A operand's layout, so P and dS go to the next product in registers. A tile a
// consumer multiplies on every step (K and V in the dK/dV pass at head dim 64, Q and dO in the
// dQ pass) is read into that layout once with ldmatrix (load_a_fragments): those products then read
// only their B tile from shared memory.
//
// The global tensors are described to TMA as 4-d [batch][len][heads][D] with box
// [1][rows][1][64]: rows past len (the tail of a sequence) come back as zeros, never the next
// sequence's, and need no mask where zeros are harmless.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes from the runtime)
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention_common.cuh"
#include "kernels/head_grouped_order.h"

// Only the sm_90a device pass compiles the kernel bodies; other architectures get empty
// kernels that flash_attention_sm90_supports never lets run.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FRUGAL_SM90_DEVICE_CODE 0  // a device pass for another architecture: empty kernels
#else
#define FRUGAL_SM90_DEVICE_CODE 1
#endif

namespace frugal::cuda::sm90 {

using namespace flash;
using bf16 = __nv_bfloat16;
using ::frugal::cpu::AttentionShape;
using work_order::HeadGroupedOrder;

constexpr int kWarpgroupThreads = 128;
// Producer + 2 consumers: the backward's passes and the head-dim-128 forward (the head-dim-64
// forward has its own count, forward_threads).
constexpr int kThreads = 3 * kWarpgroupThreads;
constexpr int kRowsPerConsumer = 64;  // the M of every wgmma
constexpr int kRowsPerWarp = kRowsPerConsumer / 4;  // of a wgmma accumulator's rows
constexpr int kSwizzleBytes = 128;    // one swizzled row of a column block: 64 bf16
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
  // Thread 0 initialises them (`full_arrivals` arrivals complete a stage, `empty_arrivals` free
  // it: every consumer thread's), then the block syncs.
  __device__ void init(uint32_t full_arrivals, uint32_t empty_arrivals = kConsumerThreads) const {
    if (threadIdx.x == 0) {
      mbarrier_init(once, 1);
      for (int stage = 0; stage < kStages; ++stage) {
        mbarrier_init(full(stage), full_arrivals);
        mbarrier_init(empty(stage), empty_arrivals);
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

// Asks the copy engine to bring rows [row, row + kRows) of one head (all D / 64 column blocks)
// into L2, without waiting or a destination: a persistent block's producer issues it for the
// next item's query rows (and dO's, in the dQ pass) while an item runs, so that their load,
// which can start only once the item's last product has read the rows before them, is served
// from L2 rather than HBM in the short time before the next item's first product needs them.
template <int D, int kRows>
__device__ __forceinline__ void tma_prefetch_rows(const CUtensorMap* map, int head, int row,
                                                  int batch) {
#pragma unroll
  for (int block = 0; block < D / kSwizzleColumns; ++block)
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(block * kSwizzleColumns), "r"(head), "r"(row), "r"(batch)
                 : "memory");
}

// The producer thread's loop of the forward and dQ kernels: key tile t (keys from
// key0 + t * kBlockN) of kv head g is load number `loaded + t` through the ring (`loaded`: the
// tiles this block loaded before, for earlier work items), so it goes into stage
// (loaded + t) % kStages once the consumers have freed it, K at k_tile(stage), V at
// v_tile(stage).
template <int D, int kBlockN, int kStages, class KTile, class VTile>
__device__ __forceinline__ void load_kv_tiles(const StageBarriers<kStages>& bars, KTile k_tile,
                                              VTile v_tile, uint32_t stage_bytes,
                                              const CUtensorMap* k_map, const CUtensorMap* v_map,
                                              int g, int b, int key0, int n_tiles, int loaded) {
  for (int t = 0; t < n_tiles; ++t) {
    const int stage = (loaded + t) % kStages;
    mbarrier_wait(bars.empty(stage), (((loaded + t) / kStages) & 1) ^ 1);
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

// Named barriers (ids 1-15; 0 is __syncthreads): `threads` threads, a multiple of 32, take part.
// sync waits for all of them; arrive counts this warp in and goes on.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Programmatic dependent launch (launch_tail): a grid lets the next one on its stream start once
// each of its blocks has said so (or ended); the waiting side's thread waits until the grids
// before its own have ended and their writes are visible. Both do nothing to a grid launched
// without the overlap.
__device__ __forceinline__ void let_next_grid_start() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void wait_for_grids_before() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Orders this thread's ordinary shared-memory (or global) accesses before later ones of the
// async proxy (wgmma operands, bulk copies), and the async proxy's completed ones before this
// thread's later ordinary ones.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// Four 8x8 bf16 matrices, register r of the warp's m16n8 fragments, stored transposed: lanes
// 8 i .. 8 i + 7 give the addresses of the 16-byte rows of matrix i, and row c receives the
// matrix's column c.
__device__ __forceinline__ void stmatrix_x4_transposed(uint32_t address, const uint32_t (&r)[4]) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address),
      "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
      : "memory");
}
// Four 8x8 bf16 matrices into register r of the warp's m16n8 fragments: lanes 8 i .. 8 i + 7
// give the addresses of the 16-byte rows of matrix i (stmatrix's counterpart, untransposed).
__device__ __forceinline__ void ldmatrix_x4(uint32_t address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
// TMA from shared memory to the box at coordinates (column, head, row, batch) of `map`, in this
// thread's current bulk group: the tile at src written there (kWrite) or added element by
// element in the map's type (kAdd); elements outside the tensor are left alone.
enum class BulkStore { kWrite, kAdd };
template <BulkStore kStore>
__device__ __forceinline__ void tma_store_tile(const CUtensorMap* map, uint32_t src, int column,
                                               int head, int row, int batch) {
  const uint64_t at = reinterpret_cast<uint64_t>(map);
  if constexpr (kStore == BulkStore::kAdd)
    asm volatile(
        "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
        " [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(at),
        "r"(column), "r"(head), "r"(row), "r"(batch), "r"(src)
        : "memory");
  else
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
        " [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(at),
        "r"(column), "r"(head), "r"(row), "r"(batch), "r"(src)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until at most kPending of this thread's bulk groups have still to read their shared source.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Until at most kPending of this thread's bulk groups are still incomplete (writes included).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ int load_acquire(const int* at) {
  int value;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(at) : "memory");
  return value;
}
__device__ __forceinline__ void add_release(int* at, int value) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(at), "r"(value) : "memory");
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

// The descriptors below are a tile's descriptor plus the operand's offset in 16-byte units: the
// same values as matrix_descriptor of the operand's address (a shared-memory address is below
// 2^18, so the start field takes the sum without a carry), but the tile's part is computed once
// and every wgmma of a product adds a constant instead of masking and shifting its own address
// (uniform-datapath arithmetic, much of it descriptors, was about 30 % of the head-dim-128
// dK/dV loop's executed instructions; ncu, H200, 2026-12-03).
// K-major operand: rows [row0, row0 + 8 m) of a tile of kRows rows, contraction columns
// [16 kk, 16 kk + 16).
template <int kRows>
__device__ __forceinline__ uint64_t k_major(uint32_t tile, int row0, int kk) {
  const uint32_t offset =
      (kk / 4) * column_block_bytes(kRows) + row0 * kSwizzleBytes + (kk % 4) * 32;
  return matrix_descriptor(tile, 16, kSwizzlePeriodBytes) + (offset >> 4);
}
// MN-major B operand: contraction rows [16 kk, 16 kk + 16) of a tile of kRows rows, all its
// columns as n.
template <int kRows>
__device__ __forceinline__ uint64_t mn_major(uint32_t tile, int kk) {
  return matrix_descriptor(tile, column_block_bytes(kRows), kSwizzlePeriodBytes) +
         ((kk * 16 * kSwizzleBytes) >> 4);
}

// wgmma m64nNk16, bf16 inputs, fp32 accumulators d (N / 2 per thread). _ss: A from shared
// memory, K-major; _rs: A from registers (the m64k16 fragment). B from shared memory, K-major
// (its contraction index along its rows) or MN-major (down its rows: imm-trans-b = 1).
// accumulate false: d = A B.
enum class BMajor { k = 0, mn = 1 };

template <BMajor kB>
__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[32], uint64_t a, uint64_t b,
                                                bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(int(accumulate)), "n"(int(kB)));
}

template <BMajor kB>
__device__ __forceinline__ void wgmma_m64n128_ss(float (&d)[64], uint64_t a, uint64_t b,
                                                 bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, %67;\n}\n"
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
      : "l"(a), "l"(b), "r"(int(accumulate)), "n"(int(kB)));
}

template <BMajor kB>
__device__ __forceinline__ void wgmma_m64n64_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                                bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)), "n"(int(kB)));
}

template <BMajor kB>
__device__ __forceinline__ void wgmma_m64n128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                                 bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
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
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)), "n"(int(kB)));
}

// The products of N columns above, by N.
template <int N, BMajor kB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b,
                                         bool accumulate) {
  if constexpr (N == 64)
    wgmma_m64n64_ss<kB>(d, a, b, accumulate);
  else
    wgmma_m64n128_ss<kB>(d, a, b, accumulate);
}
template <int N, BMajor kB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b,
                                         bool accumulate) {
  if constexpr (N == 64)
    wgmma_m64n64_rs<kB>(d, a, b, accumulate);
  else
    wgmma_m64n128_rs<kB>(d, a, b, accumulate);
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

// The register A operands of rows [row0, row0 + 64) of the K-major tile (kRows rows of D): this
// warp's 16 rows (row0 + 16 warp ..), one fragment per 16 contraction columns, read through the
// 128-byte swizzle (lane l gives row l % 8 + 8 ((l / 8) % 2) of the columns' left or right 8).
template <int D, int kRows>
__device__ __forceinline__ void load_a_fragments(uint32_t (&a)[D / 16][4], uint32_t tile, int row0,
                                                 int warp, int lane) {
  const int row = row0 + 16 * warp + lane % 8 + 8 * ((lane / 8) % 2);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int chunk = 2 * (kk % 4) + lane / 16;
    ldmatrix_x4(tile + (kk / 4) * column_block_bytes(kRows) + row * kSwizzleBytes +
                    ((chunk ^ (row % 8)) * 16),
                a[kk]);
  }
}
// acc = A B^T over the head dim, A in registers (load_a_fragments), B all kN rows of the K-major
// tile b, as one commit group: issue_product_ss with A read once into registers.
template <int D, int kN>
__device__ __forceinline__ void issue_product_rs_k(float (&acc)[kN / 2],
                                                   const uint32_t (&a)[D / 16][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_rs<kN, BMajor::k>(acc, a[kk], k_major<kN>(b, 0, kk), kk > 0);
  wgmma_commit();
}

// The two kinds of product every kernel here issues, each closed as one commit group (the
// caller fences before them and waits after).
// acc = A B^T over the head dim: rows [a_row0, a_row0 + 64) of the K-major tile a (kRowsA rows)
// against the first kN rows of the K-major tile b (kRowsB rows).
template <int D, int kRowsA, int kN, int kRowsB = kN>
__device__ __forceinline__ void issue_product_ss(float (&acc)[kN / 2], uint32_t a, int a_row0,
                                                 uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss<kN, BMajor::k>(acc, k_major<kRowsA>(a, a_row0, kk), k_major<kRowsB>(b, 0, kk), kk > 0);
  wgmma_commit();
}
// acc += A B: A in registers (the first kK / 16 of a's fragments, 16 contraction columns each),
// B the first kK rows (all D columns) of the MN-major tile b of kRowsB rows.
template <int D, int kK, int kRowsB = kK, int kFragments>
__device__ __forceinline__ void issue_product_rs(float (&acc)[D / 2],
                                                 const uint32_t (&a)[kFragments][4], uint32_t b) {
  static_assert(kK / 16 <= kFragments, "fewer A fragments than contraction columns");
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    wgmma_rs<D, BMajor::mn>(acc, a[kk], mn_major<kRowsB>(b, kk), true);
  wgmma_commit();
}

// ---- work items of the query-block kernels (the forward and the dQ pass) ---------------------

// Work item i of `order`: kBlockM query rows from q0 of head h of batch b (rank 0 of a (batch,
// head) pair is its last query block, the longest), and the key tiles of kBlockN keys that some
// row of it sees, n_tiles of them from kv_begin (none when no row sees a key; kv_begin > 0 only
// under a sliding window or with packed documents: tiles wholly before the first row's window or
// document are never loaded).
struct QueryItem {
  int b, h, q0, last_row, kv_begin, n_tiles;
};
// The first key of an item's first tile: its first row's first key (window, document), down to a
// tile's start.
template <int kBlockN>
__device__ __forceinline__ int item_kv_begin(int b, int q0, const Params& p) {
  return first_key_of_row(b, q0, p) / kBlockN * kBlockN;
}
// kBlocksBelow: whether the order may leave blocks below its items to another launch
// (HeadGroupedOrder::blocks_below; the forward's walk with a tail): the dQ pass, whose order
// never does, keeps the add out of its registers.
template <int kBlockM, int kBlockN, bool kBlocksBelow = false>
__device__ __forceinline__ QueryItem query_item(const HeadGroupedOrder& order, const Params& p,
                                                int i) {
  QueryItem w;
  int bh, rank;
  order.at(i, bh, rank);
  w.b = bh / p.n_heads;
  w.h = bh % p.n_heads;
  w.q0 = (kBlocksBelow ? order.block_of_rank(rank) : order.items_per_pair - 1 - rank) * kBlockM;
  w.last_row = min(w.q0 + kBlockM, p.q_len) - 1;
  const int kv_end = keys_seen(w.last_row, p);
  w.kv_begin = item_kv_begin<kBlockN>(w.b, w.q0, p);
  w.n_tiles = kv_end > w.kv_begin ? (kv_end - w.kv_begin + kBlockN - 1) / kBlockN : 0;
  return w;
}
// The item this block takes in round `round` of its walk (query_grid). Persistent blocks take the
// items in rounds of gridDim.x, walking even rounds forwards and odd ones backwards, so that a
// block's loads even out over the rounds (items along a round vary in length). With a block per
// item the walk is one round: block i, item i.
__device__ __forceinline__ int item_of_round(int round) {
  const int slot = round % 2 == 0 ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
  return round * static_cast<int>(gridDim.x) + slot;
}

#endif  // FRUGAL_SM90_DEVICE_CODE

// ---- host side -------------------------------------------------------------------------------

// cuTensorMapEncodeTiled is a driver function; asking the runtime for it keeps the build free of
// -lcuda. Looked up once: the pointer stays valid for the life of the process.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
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
inline CUtensorMap tensor_map(const bf16* data, int64_t batch, int64_t len, int64_t heads,
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

// Tiles of a kernel's work items by HeadGroupedOrder rank, for `items_per_pair` items.
using TilesByRank = std::vector<int> (*)(const Params& p, int items_per_pair);

// HeadGroupedOrder's group size for a grid of `pairs` pairs on this device
// (work_order::choose_pairs_per_group with its SMs and L2), remembered per launch shape: the
// choice can take a millisecond, a launch looks it up in well under a microsecond, and the
// tiles are counted only the first time.
int pairs_per_group(const Params& p, int pairs, int items_per_pair, TilesByRank tiles_by_rank,
                    int64_t shared_bytes_per_pair);

// How a query-block kernel (the forward, the dQ pass) takes its items: a block per item, or
// persistent blocks walking them (query_grid says when), the walk's shortest items optionally
// left to a tail of a block per item launched after it (the kernel lets that launch start once
// its own blocks run: griddepcontrol.launch_dependents).
enum class QueryWalk { kBlockPerItem, kPersistent, kPersistentThenTail };

// The grid of a query-block kernel over `items_per_pair` items of each of `pairs` (batch, head)
// pairs, HeadGroupedOrder as pairs_per_group chooses it: persistent (one block per SM, or per
// item if fewer, walking the items: the next item's loads overlap this one's epilogue, 3-16%
// faster forwards on an H200 at 2k-4k tokens) while a sequence holds at most
// kPersistentQueryBlocks items. Longer sequences get a block per item, which the hardware hands
// out in order as SMs free up: with items of very different lengths that ended more evenly than
// the two walks tried, a plain stride and the rounds walked both ways (4-9% faster forwards at
// 8k-16k tokens). A kernel that walks no more than one item a block asks for kBlockPerItem.
// With kPersistentThenTail the walk ends unevenly (its rounds give the blocks different loads),
// so each pair's shortest items may go to a second grid, a block per item (tail_blocks of them
// in tail_order, none when the simulation gives the tail no gain: choose_tail_ranks, a tail
// block's start costing tail_block_start_tiles key tiles), which the hardware starts on the SMs
// the walkers leave.
struct QueryGrid {
  unsigned blocks;
  HeadGroupedOrder order;
  unsigned tail_blocks = 0;
  HeadGroupedOrder tail_order{0, 0, 1};
};
QueryGrid query_grid(const Params& p, int64_t pairs, int64_t items_per_pair,
                     TilesByRank tiles_by_rank, int64_t shared_bytes_per_pair, QueryWalk walk,
                     double tail_block_start_tiles = 0.0);

// Launches `kernel` as the tail of the grid launched just before it on `stream`
// (QueryGrid::tail_blocks): programmatic stream serialization lets its blocks start as the
// walkers' SMs free up, once every walker has run griddepcontrol.launch_dependents. The tail
// reads the walk's inputs and writes other rows than the walk, so its blocks need not wait for
// it; the kernel's last block does before it ends, so that the next kernel on the stream, which
// waits for the tail alone, sees the walk's writes too (a test program on an H200 saw such a
// kernel read a primary's write stale in 3 of 50 runs without that wait, none of 100 in a
// second session; none with it).
template <class... KernelArgs, class... Args>
void launch_tail(void (*kernel)(KernelArgs...), unsigned blocks, unsigned threads, int smem,
                 cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &overlap;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

// The key tiles (of kBlockN keys) each block of kBlockM query rows loads, by HeadGroupedOrder
// rank: rank 0 is the last block, the one that sees the most keys (as the forward and dQ
// kernels count them). Causal and window only: packed documents live on the device, where the
// kernels skip the tiles outside them; the schedule is then sized for the causal costs.
template <int kBlockM, int kBlockN>
std::vector<int> key_tiles_by_rank(const Params& p, int q_blocks) {  // a TilesByRank
  std::vector<int> tiles(q_blocks);
  for (int rank = 0; rank < q_blocks; ++rank) {
    const int q0 = (q_blocks - 1 - rank) * kBlockM;
    const int kv_end = keys_seen(std::min(q0 + kBlockM, p.q_len) - 1, p);
    const int kv_begin = first_key_seen(q0, p) / kBlockN * kBlockN;
    tiles[rank] = kv_end > kv_begin ? (kv_end - kv_begin + kBlockN - 1) / kBlockN : 0;
  }
  return tiles;
}

// The rows [row0, row0 + kRows) of one head (those below len) of a backward block that adds
// nothing to them (no query sees its keys, or its queries see no key): zeros when the gradients
// are written (bf16), nothing to do when they accumulate. 16-byte stores by kThreadCount threads
// (this one is number `thread`); head and stride keep rows 16-byte aligned.
template <int D, int kRows, class GradT, int kThreadCount = kThreads>
__device__ __forceinline__ void write_untouched_rows(GradT* head, int row0, int len, int64_t stride,
                                                     int thread) {
  if constexpr (!std::is_same_v<GradT, float>) {
    for (int e = thread; e < kRows * D / 8; e += kThreadCount) {
      const int r = e / (D / 8), c = e % (D / 8);
      if (row0 + r < len)
        *reinterpret_cast<uint4*>(head + (row0 + r) * stride + c * 8) = make_uint4(0, 0, 0, 0);
    }
  }
}

// Row r of a thread's wgmma accumulator (value 4 j + 2 r + e: row warp 16 + lane / 4 + 8 r,
// column 8 j + 2 (lane % 4) + e) times scale, put from `first` (that row's column 2 (lane % 4))
// as put_gradient_pairs does: the added (fp32) or written-in-place epilogue of a gradient.
template <int D, class GradT>
__device__ __forceinline__ void put_accumulator_row(GradT* first, const float (&acc)[D / 2], int r,
                                                    float scale) {
  put_gradient_pairs<D / 8>(first, [&](int j) {
    return make_float2(scale * acc[4 * j + 2 * r], scale * acc[4 * j + 2 * r + 1]);
  });
}

// Named barrier kBarrier + consumer, one per consumer, of `threads` threads: kWait syncs,
// otherwise this thread arrives and goes on. The ids reach ptxas as constants (it reserves every
// barrier for a computed one).
template <int kBarrier, bool kWait>
__device__ __forceinline__ void consumer_barrier(int consumer, int threads) {
  if (consumer == 0) {
    if constexpr (kWait)
      named_barrier_sync(kBarrier, threads);
    else
      named_barrier_arrive(kBarrier, threads);
  } else {
    if constexpr (kWait)
      named_barrier_sync(kBarrier + 1, threads);
    else
      named_barrier_arrive(kBarrier + 1, threads);
  }
}

// Named barriers 6 and 7 (one per consumer) of the written gradients' epilogue, clear of the
// fused dK/dV kernel's 1-5.
constexpr int kBarrierGradientsStaged = 6;

// One lane's bf16 pairs of accumulator row `row` (pair_at(j): columns 8 j + 2 (lane % 4) and the
// next, packed) into `tile`, kTileRows rows in 128-byte swizzled column blocks, the layout TMA
// loads and stores. Conflict-free: a warp's 8 rows of one 16-byte chunk land on 8 different
// chunks.
template <int D, int kTileRows, class PairAt>
__device__ __forceinline__ void stage_row_pairs(uint32_t tile, int row, int lane, PairAt pair_at) {
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    const uint32_t at = tile + (j / 8) * column_block_bytes(kTileRows) + row * kSwizzleBytes +
                        (((j % 8) ^ (row % 8)) * 16) + (lane % 4) * 4;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pair_at(j)) : "memory");
  }
}

// The copy engine's stores of staged rows: a box of `map`'s rows (a consumer's 64, or a warp's 16)
// from row `first_row` of `tile` (kTileRows rows in 128-byte swizzled column blocks) to rows
// row + first_row on of head `head`, batch `batch` of `map` (rows past the tensor's end are not
// written). Issued, not committed.
template <int D, int kTileRows>
__device__ __forceinline__ void store_staged_rows(const CUtensorMap* map, uint32_t tile,
                                                  int first_row, int head, int row, int batch) {
#pragma unroll
  for (int block = 0; block < D / kSwizzleColumns; ++block)
    tma_store_tile<BulkStore::kWrite>(
        map, tile + block * column_block_bytes(kTileRows) + first_row * kSwizzleBytes,
        block * kSwizzleColumns, head, row + first_row, batch);
}

// A written (bf16) gradient's rows, as a consumer's epilogue puts them: the wgmma accumulator
// acc (value 4 j + 2 r + e: row warp 16 + lane / 4 + 8 r, column 8 j + 2 (lane % 4) + e) times
// scale, staged in the consumer's 64 rows of `tile` (kTileRows rows in 128-byte swizzled column
// blocks, the layout TMA loads and stores; free once the consumer's products have read it), and
// where they go: the block's first row `row` of head `head`, batch `batch` of `map` (boxes of
// 64 rows, a consumer's 64 further on; rows past the tensor's end are not written).
template <int D>
struct GradientRows {
  const CUtensorMap* map;
  uint32_t tile;
  float scale;
  const float (&acc)[D / 2];
  int head, row, batch;
};
// This consumer's rows of each gradient through shared memory (stage_row_pairs) and the copy
// engine: 4-byte stores scattered over rows cost the passes a tenth of their time in the store
// queue and in draining it at exit (ncu, H200, 2026-12-03). One thread per consumer issues the
// stores and waits until they have read shared memory (the block's shared memory outlives the
// reads); a caller that stages into the same tile again syncs the consumer first, as the others
// did not wait.
template <int D, int kTileRows, class... Rows>
__device__ __forceinline__ void write_gradient_rows(int consumer, int warp, int lane,
                                                    const Rows&... rows) {
  const int row0 = consumer * kRowsPerConsumer;
  auto stage = [&](const GradientRows<D>& g) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      stage_row_pairs<D, kTileRows>(
          g.tile, row0 + warp * kRowsPerWarp + lane / 4 + 8 * r, lane, [&](int j) {
            return pack_bf16(g.scale * g.acc[4 * j + 2 * r], g.scale * g.acc[4 * j + 2 * r + 1]);
          });
  };
  (stage(rows), ...);
  fence_proxy_async_shared();
  consumer_barrier<kBarrierGradientsStaged, true>(consumer, kWarpgroupThreads);
  if (threadIdx.x % kWarpgroupThreads != 0) return;
  (store_staged_rows<D, kTileRows>(rows.map, rows.tile, row0, rows.head, rows.row, rows.batch),
   ...);
  bulk_commit();
  bulk_wait_read<0>();
}

// The forward's epilogue through shared memory, as write_gradient_rows (and for the same
// reason): this consumer's rows of out = O / sum in bf16 staged in its 64 rows of `tile` (a key
// tile the block's products no longer read, kTileRows rows) and stored by the copy engine from
// the item's first row `row0` of head `head`, batch `batch` of `out_map` (boxes of a warp's 16
// rows; rows past q_len are not written); lse by the lanes. Each warp's first lane stores the
// warp's rows and waits until the stores have read them, so the warps of a consumer do not wait
// for each other (a barrier across the consumer, then one thread's stores of all 64 rows, took
// the forwards 0.5-1.5 % longer at 2k-4k tokens, H200). Returns once the warp's rows are read.
template <int D, int kTileRows, class OAt>
__device__ __forceinline__ void write_output_rows_staged(const CUtensorMap* out_map, uint32_t tile,
                                                         int head, int row0, int batch,
                                                         float* lse_head, int consumer, int warp,
                                                         int lane, const float (&row_sum)[2],
                                                         const float (&row_max)[2], const Params& p,
                                                         OAt o_at) {
  const int consumer_row0 = consumer * kRowsPerConsumer;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int row = consumer_row0 + warp * kRowsPerWarp + lane / 4 + 8 * r;
    stage_row_pairs<D, kTileRows>(tile, row, lane, [&](int j) {
      return pack_bf16(o_at(j, r, 0) * inv, o_at(j, r, 1) * inv);
    });
    if (lane % 4 == 0 && row0 + row < p.q_len)
      lse_head[row0 + row] = lse_of_row(sum, row_max[r], p);
  }
  fence_proxy_async_shared();
  __syncwarp();
  if (lane == 0) {
    store_staged_rows<D, kTileRows>(out_map, tile, consumer_row0 + warp * kRowsPerWarp, head, row0,
                                    batch);
    bulk_commit();
    bulk_wait_read<0>();
  }
  __syncwarp();
}

// The map a gradient leaves through when written (bf16): boxes of a consumer's 64 rows of
// [batch][len][heads][head_dim]. Added (fp32) gradients have none: `stand_in` takes its place in
// the launch.
template <class GradT>
CUtensorMap written_gradient_map(const GradT* gradient, int64_t batch, int64_t len, int64_t heads,
                                 int64_t head_dim, const CUtensorMap& stand_in) {
  if constexpr (std::is_same_v<GradT, bf16>)
    return tensor_map(gradient, batch, len, heads, head_dim, kRowsPerConsumer);
  else
    return stand_in;
}

// The backward's passes, after flash_attention_backward_prepare (the outline is in
// flash_attention_sm90.cu). dkdv_pass: dk, dv, and with dq_turns (the scratch's turn counters)
// also dq (fp32 only: the key blocks add into it); dq_pass: dq, when dkdv_pass was given no
// dq_turns. GradT: float (accumulated) or bf16 (written), as put_gradient_pair.
template <class GradT>
void dkdv_pass(float* dq, GradT* dk, GradT* dv, const bf16* dout, const bf16* q, const bf16* k,
               const bf16* v, const float* lse_log2, const float* delta, int* dq_turns,
               const AttentionShape& s, cudaStream_t stream);
template <class GradT>
void dq_pass(GradT* dq, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
             const float* lse_log2, const float* delta, const AttentionShape& s,
             cudaStream_t stream);

}  // namespace frugal::cuda::sm90
