// OpenBLAS as frugal's host kernels use it (kernels/cpu/linear.cpp, kernels/cpu/dense.cpp).
//
// One thread pool, not two: OpenBLAS's own threads and OpenMP's fight over the cores (OpenMP
// threads spin after each parallel region while OpenBLAS's wait for a core), which halved
// training throughput on two cores; and a multi-threaded sgemm called from each of OpenMP's
// threads asks for threads squared. So OpenBLAS runs single-threaded and each product is split
// into blocks of output rows or columns, one per OpenMP thread.
#pragma once

#include <cblas.h>

#include <cstdint>

namespace frugal::cpu {

// cblas takes int sizes; a matrix side beyond INT_MAX is a caller bug, not a user error.
blasint blas_size(int64_t n);

// Makes OpenBLAS single-threaded if it is not (it starts with a thread per core). Every host
// product calls it first: a GPU run reaches the host products (GaLore's under offload) without
// ever running a linear layer on the host, so setting it once there is not enough.
void use_single_threaded_blas();

}  // namespace frugal::cpu
