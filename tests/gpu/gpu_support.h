// Helpers shared by the GPU test programs: skipping cleanly without a GPU, and device buffers
// that can hand kernels a deliberately unaligned pointer.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "catch_compat.h"
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
  template <class H>
  std::vector<H> download() {
    static_assert(sizeof(H) == sizeof(T));
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<H> host(n_);
    CUDA_CHECK(cudaMemcpy(host.data(), get(), sizeof(T) * n_, cudaMemcpyDeviceToHost));
    return host;
  }
  std::vector<uint16_t> download_bits() { return download<uint16_t>(); }

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
