// CUDA error checks: CUDA_CHECK(call) after every runtime call, CUDA_CHECK_LAUNCH() after every
// kernel launch; both throw frugal::Error naming the call, the file, the line and CUDA's message.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace frugal::cuda {

// Throws frugal::Error when `status` is not cudaSuccess; `what` is the failing expression.
inline void check_cuda(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess)
    ::frugal::fail("CUDA error: ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
                   ") in ", what, " at ", file, ":", line);
}

}  // namespace frugal::cuda

// CUDA_CHECK(cudaMemcpyAsync(...)): throws frugal::Error on failure.
#define CUDA_CHECK(call) ::frugal::cuda::check_cuda((call), #call, __FILE__, __LINE__)

// After a kernel<<<...>>>(...) launch: catches bad launch configurations right away.
#define CUDA_CHECK_LAUNCH() \
  ::frugal::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
