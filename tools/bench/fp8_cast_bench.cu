// bench_fp8_cast: times kernels/cuda/fp8.cu's cast (bf16 -> E4M3 codes, plain, transposed or
// both) on the activation and weight shapes of the TinyLlama-1.1B and Llama-2-7B-width FP8
// benchmarks, and prints one JSON line per case: the median time of the timed runs and the
// memory traffic it achieved (bf16 read + codes written) against the device's copy bandwidth
// measured in the same run (cudaMemcpy device to device, read + write counted).
//
// usage: bench_fp8_cast [--iters N]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8.h"

namespace {

using bf16 = __nv_bfloat16;

__global__ void fill(bf16* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t z = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
    x[i] = __float2bfloat16(static_cast<float>(z >> 40) / float(1 << 24) - 0.5f);
  }
}

template <class F>
float median_ms(int iters, F&& launch) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(start));
    launch();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_fp8_cast [--iters N]\n");
      return 2;
    }
  }
  using namespace frugal::cuda;
  struct Case {
    const char* what;
    int64_t rows, cols;
  };
  const Case cases[] = {{"tinyllama activation [8192, 2048]", 8192, 2048},
                        {"tinyllama mlp activation [8192, 5632]", 8192, 5632},
                        {"tinyllama weight [5632, 2048]", 5632, 2048},
                        {"7b-width activation [8192, 4096]", 8192, 4096},
                        {"7b-width mlp activation [8192, 11008]", 8192, 11008},
                        {"7b-width weight [11008, 4096]", 11008, 4096}};
  int64_t largest = 0;
  for (const Case& c : cases) largest = std::max(largest, c.rows * c.cols);
  bf16* x = nullptr;
  uint8_t *out = nullptr, *out_t = nullptr;
  float* scalars = nullptr;  // scale, scale_inv, amax
  int64_t* counts = nullptr;
  CUDA_CHECK(cudaMalloc(&x, largest * sizeof(bf16)));
  CUDA_CHECK(cudaMalloc(&out, largest));
  CUDA_CHECK(cudaMalloc(&out_t, largest));
  CUDA_CHECK(cudaMalloc(&scalars, 3 * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&counts, 3 * sizeof(int64_t)));
  fill<<<1024, 256>>>(x, largest);
  const float init[3] = {64.0f, 1.0f / 64, 0.0f};
  CUDA_CHECK(cudaMemcpy(scalars, init, sizeof init, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(counts, 0, 3 * sizeof(int64_t)));
  const Fp8CastState state{scalars, scalars + 1, scalars + 2, nullptr, counts, 0};

  const float copy_ms = median_ms(iters, [&] {
    CUDA_CHECK(cudaMemcpyAsync(out_t, x, size_t(largest), cudaMemcpyDeviceToDevice));
  });
  const double copy_gbs = 2.0 * double(largest) / (copy_ms * 1e-3) / 1e9;
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"bench\": \"fp8_cast\", \"device\": \"%s\", \"copy_gb_per_s\": %.1f}\n",
              prop.name, copy_gbs);
  for (const Case& c : cases) {
    const int64_t n = c.rows * c.cols;
    for (int outputs = 1; outputs <= 3; ++outputs) {  // 1 plain, 2 transposed, 3 both
      uint8_t* plain = outputs & 1 ? out : nullptr;
      uint8_t* transposed = outputs & 2 ? out_t : nullptr;
      const float ms = median_ms(iters, [&] {
        fp8_cast_transpose(plain, transposed, x, c.rows, c.cols, Fp8Format::e4m3, state, nullptr);
      });
      const double bytes = double(n) * (2 + (outputs == 3 ? 2 : 1));
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      std::printf(
          "{\"case\": \"%s\", \"outputs\": \"%s\", \"ms\": %.4f, \"gb_per_s\": %.1f, "
          "\"of_copy\": %.3f}\n",
          c.what, outputs == 1 ? "plain" : outputs == 2 ? "transposed" : "both", ms, gbs,
          gbs / copy_gbs);
    }
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}
