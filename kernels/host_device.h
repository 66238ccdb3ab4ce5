// FRUGAL_HOST_DEVICE marks a function that the CPU kernels and the CUDA kernels share (one
// definition of a random stream or a hash, compiled for both): __host__ __device__ under nvcc,
// nothing otherwise.
#pragma once

#ifdef __CUDACC__
#define FRUGAL_HOST_DEVICE __host__ __device__
#else
#define FRUGAL_HOST_DEVICE
#endif
