// Ring attention against attention alone, on GPUs: one layer's attention forward + backward of
// a long sequence, split over the ranks by the zigzag layout and run as a ring over NCCL,
// against the same attention on the whole sequence on one GPU with no communication, divided
// by the number of ranks (the ideal split). fraction = ideal / ring.
// usage: mpirun -np P bench_ring_attention [seq heads kv_heads head_dim]  (default: 131072 32 4
// 64, TinyLlama's attention). Honours NCCL_* settings and FRUGAL_ATTENTION_SM90, as frugal does.
// Prints one JSON line (rank 0).
#include <cstdio>
#include <cstdlib>
#include <memory>

#include <mpi.h>

#include "core/device.h"
#include "parallel/mesh.h"
#include "parallel/nccl_comm.h"
#include "parallel/ring_attention.h"
#include "ops/ops.h"

using namespace frugal;

namespace {

Tensor random_bf16(const Shape& shape, uint32_t seed, DeviceContext& gpu) {
  Tensor host = Tensor::empty(shape, DType::f32);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < host.numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    host.data<float>()[i] = float(int64_t(x % 2001) - 1000) / 1000.0f;
  }
  return ops::convert(ops::convert(host, DType::f32, gpu.device_memory()), DType::bf16,
                      gpu.device_memory());
}

// Milliseconds per call of f: the mean of `repeats` calls after one warm-up call.
template <class F>
double time_ms(DeviceContext& gpu, int repeats, F&& f) {
  f();
  gpu.synchronize();
  Event start(true), stop(true);
  start.record(gpu.compute());
  for (int r = 0; r < repeats; ++r) f();
  stop.record(gpu.compute());
  stop.synchronize();
  return stop.elapsed_ms_since(start) / repeats;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    const int64_t seq = argc > 1 ? std::atoll(argv[1]) : 131072;
    const int64_t heads = argc > 2 ? std::atoll(argv[2]) : 32;
    const int64_t kv_heads = argc > 3 ? std::atoll(argv[3]) : 4;
    const int64_t head_dim = argc > 4 ? std::atoll(argv[4]) : 64;
    ops::set_kernel_options(
        ops::kernel_options_from_environment(std::getenv("FRUGAL_ATTENTION_SM90")));
    auto mpi = make_mpi_world_comm(600);
    DeviceContext gpu(local_rank_from_environment());
    auto nccl = make_nccl_comm(*mpi, gpu, 600);
    ops::bind_device(&gpu);
    const int P = nccl->size(), rank = nccl->rank();

    double alone_ms = 0;
    if (rank == 0) {
      const Tensor q = random_bf16({seq, heads, head_dim}, 1, gpu);
      const Tensor k = random_bf16({seq, kv_heads, head_dim}, 2, gpu);
      const Tensor v = random_bf16({seq, kv_heads, head_dim}, 3, gpu);
      const Tensor dout = random_bf16({seq, heads, head_dim}, 4, gpu);
      alone_ms = time_ms(gpu, 3, [&] {
        const ops::Attention a = ops::attention(q, k, v, 1);
        ops::attention_backward(dout, q, k, v, a, 1);
      });
    }
    nccl->barrier();
    const ZigzagLayout layout = zigzag_layout(seq, P, rank);
    const int64_t local = layout.local_len();
    const Tensor q = random_bf16({local, heads, head_dim}, 11 + rank, gpu);
    const Tensor k = random_bf16({local, kv_heads, head_dim}, 21 + rank, gpu);
    const Tensor v = random_bf16({local, kv_heads, head_dim}, 31 + rank, gpu);
    const Tensor dout = random_bf16({local, heads, head_dim}, 41 + rank, gpu);
    const double ring_ms = time_ms(gpu, 3, [&] {
      const ops::Attention a = ring_attention_forward(q, k, v, 1, *nccl);
      ring_attention_backward(dout, q, k, v, a, 1, *nccl);
    });
    // The ring keeps the ranks in step: their mean is the ring's time.
    const double ring_mean_ms = mpi->all_reduce_sum(ring_ms) / P;
    if (rank == 0) {
      const char* p2p = std::getenv("NCCL_P2P_DISABLE");
      const char* shm = std::getenv("NCCL_SHM_DISABLE");
      const double flops = 3.5 * 4.0 * double(heads) * double(seq) * double(seq) * double(head_dim) / 2;
      std::printf(
          "{\"bench\": \"ring_attention\", \"ranks\": %d, \"seq\": %lld, \"heads\": %lld, "
          "\"kv_heads\": %lld, \"head_dim\": %lld, \"NCCL_P2P_DISABLE\": \"%s\", "
          "\"NCCL_SHM_DISABLE\": \"%s\", \"alone_one_gpu_ms\": %.2f, \"ideal_ms\": %.2f, "
          "\"ring_ms\": %.2f, \"fraction_of_ideal\": %.3f, \"ring_tflops_per_gpu\": %.1f}\n",
          P, (long long)seq, (long long)heads, (long long)kv_heads, (long long)head_dim,
          p2p ? p2p : "", shm ? shm : "", alone_ms, alone_ms / P, ring_mean_ms,
          alone_ms / P / ring_mean_ms, flops / P / (ring_mean_ms * 1e-3) / 1e12);
    }
    ops::bind_device(nullptr);
    nccl.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ring_attention: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
