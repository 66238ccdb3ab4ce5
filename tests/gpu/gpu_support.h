// Helpers shared by the GPU test programs: skipping cleanly without a GPU, and device buffers
// that can hand kernels a deliberately unaligned pointer.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "catch_compat.h"
#include "core/device.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/nccl_comm.h"
#include "ops/ops.h"
#include "kernels/cuda/cuda_check.h"

namespace frugal::test {

// True when a GPU is present; says "no GPU: skipping" once otherwise.
inline bool have_gpu() {
  static const bool present = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      std::printf("no GPU: skipping\n");
      cudaGetLastError();  // clear the sticky error of a failed query
      return false;
    }
    return true;
  }();
  return present;
}

// Device memory for n elements of T after `offset` leading ones (zeroed), so a test can give
// the kernels a pointer that is not 16-byte aligned.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n, size_t offset = 0) : n_(n), offset_(offset) {
    CUDA_CHECK(cudaMalloc(&base_, sizeof(T) * std::max<size_t>(n + offset, 1)));
    CUDA_CHECK(cudaMemset(base_, 0, sizeof(T) * std::max<size_t>(n + offset, 1)));
  }
  DeviceBuffer(const T* host, size_t n) : DeviceBuffer(n) {
    CUDA_CHECK(cudaMemcpy(base_, host, sizeof(T) * n, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return base_ + offset_; }
  template <class H>
  void upload(const std::vector<H>& host) {
    static_assert(sizeof(H) == sizeof(T));
    REQUIRE(host.size() == n_);
    CUDA_CHECK(cudaMemcpy(get(), host.data(), sizeof(T) * n_, cudaMemcpyHostToDevice));
  }
  template <class H = T>
  std::vector<H> download() {
    static_assert(sizeof(H) == sizeof(T));
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<H> host(n_);
    CUDA_CHECK(cudaMemcpy(host.data(), get(), sizeof(T) * n_, cudaMemcpyDeviceToHost));
    return host;
  }
  std::vector<uint16_t> download_bits() { return download<uint16_t>(); }
  void zero() { CUDA_CHECK(cudaMemset(get(), 0, sizeof(T) * n_)); }

 private:
  T* base_ = nullptr;
  size_t n_, offset_;
};

}  // namespace frugal::test

// First line of a GPU test case: without a GPU the case passes and says why.
#define SKIP_WITHOUT_GPU()             \
  do {                                 \
    if (!::frugal::test::have_gpu()) { \
      SUCCEED("no GPU: skipping");     \
      return;                          \
    }                                  \
  } while (0)

namespace frugal::test {

// One rank's GPU for the mpi_*.cpp tests: the MPI world, this rank's GPU (bound for ops/) and
// an NCCL world over it. make_gpu_world() returns null, after saying why, when this machine
// has fewer GPUs than ranks. Destroyed in order: ops unbound, NCCL, then the GPU.
struct GpuWorld {
  std::unique_ptr<Comm> mpi;
  std::unique_ptr<DeviceContext> gpu;
  std::unique_ptr<Comm> nccl;
  ~GpuWorld() {
    ops::bind_device(nullptr);
    nccl.reset();
    gpu.reset();
  }
};

inline std::unique_ptr<GpuWorld> make_gpu_world() {
  auto mpi = make_mpi_world_comm(60);
  const int gpus = device_count();
  if (gpus == 0 || gpus < mpi->size()) {
    if (mpi->rank() == 0) std::printf("needs %d GPU(s), sees %d: skipping\n", mpi->size(), gpus);
    return nullptr;
  }
  auto world = std::make_unique<GpuWorld>();
  world->mpi = std::move(mpi);
  world->gpu = std::make_unique<DeviceContext>(local_rank_from_environment());
  world->nccl = make_nccl_comm(*world->mpi, *world->gpu, 60);
  ops::bind_device(world->gpu.get());
  return world;
}

}  // namespace frugal::test
