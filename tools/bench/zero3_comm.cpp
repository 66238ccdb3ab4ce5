// The communication of one ZeRO-3 training step alone, timed on the GPU: for every unit of a
// model shape, the all-gather of its bf16 weight shards (twice: forward and backward) and the
// reduce-scatter of its fp32 gradients, posted as frugal posts them (one group per unit, on the
// communication stream). Together with the step time of 1 GPU (compute alone) and of N GPUs,
// this says how much of the communication the step hides:
//   hidden = (t_compute + t_comm - t_step) / t_comm
// usage: mpirun -np N bench_zero3_comm [hidden intermediate layers heads kv_heads vocab]
// (default: TinyLlama-1.1B). Honours NCCL_* settings. Prints one JSON line (rank 0).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include <mpi.h>

#include "core/device.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/nccl_comm.h"
#include "parallel/zero3_parameters.h"
#include "model/llama_config.h"

using namespace frugal;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    LlamaConfig c;
    const int64_t defaults[] = {2048, 5632, 22, 32, 4, 32000};
    int64_t v[6];
    for (int i = 0; i < 6; ++i) v[i] = argc > i + 1 ? std::atoll(argv[i + 1]) : defaults[i];
    c.hidden_size = v[0];
    c.intermediate_size = v[1];
    c.num_hidden_layers = v[2];
    c.num_attention_heads = v[3];
    c.num_key_value_heads = v[4];
    c.vocab_size = v[5];
    c.tie_word_embeddings = false;

    auto mpi = make_mpi_world_comm(600);
    DeviceContext gpu(local_rank_from_environment());
    auto nccl = make_nccl_comm(*mpi, gpu, 600);
    const int ranks = nccl->size();

    // Every unit's shards and whole buffers, allocated once (the step reuses cached blocks).
    struct Unit {
      std::vector<Tensor> shard16, full16, full32, shard32;
    };
    std::vector<Unit> units;
    size_t gathered_bytes = 0, reduced_bytes = 0;
    for (const UnitSpec& spec : llama_units(c)) {
      Unit u;
      for (const ParamSpec& p : spec.params) {
        const ShardLayout l = shard_layout(p, ranks);
        u.shard16.push_back(Tensor::empty(l.shard_shape(), DType::bf16, gpu.device_memory()));
        u.full16.push_back(Tensor::empty(l.padded_shape(), DType::bf16, gpu.device_memory()));
        u.full32.push_back(Tensor::empty(l.padded_shape(), DType::f32, gpu.device_memory()));
        u.shard32.push_back(Tensor::empty(l.shard_shape(), DType::f32, gpu.device_memory()));
        gathered_bytes += u.full16.back().bytes();
        reduced_bytes += u.full32.back().bytes();
      }
      units.push_back(std::move(u));
    }
    auto one_step = [&] {
      for (int pass = 0; pass < 2; ++pass)
        for (Unit& u : units) {
          std::vector<Pending> ops;
          CommGroup group(*nccl);
          for (size_t i = 0; i < u.shard16.size(); ++i)
            ops.push_back(nccl->all_gather(u.shard16[i], u.full16[i]));
          group.end();
          for (Pending& op : ops) op->wait();
        }
      for (Unit& u : units) {
        std::vector<Pending> ops;
        CommGroup group(*nccl);
        for (size_t i = 0; i < u.full32.size(); ++i)
          ops.push_back(nccl->reduce_scatter_sum(u.full32[i], u.shard32[i]));
        group.end();
        for (Pending& op : ops) op->wait();
      }
    };
    one_step();  // warm-up: NCCL sets up its channels
    gpu.synchronize();
    const int repeats = 3;
    Event start(true), stop(true);
    start.record(gpu.compute());
    for (int r = 0; r < repeats; ++r) one_step();
    stop.record(gpu.compute());
    stop.synchronize();
    const double ms = stop.elapsed_ms_since(start) / repeats;
    if (nccl->rank() == 0) {
      const char* p2p = std::getenv("NCCL_P2P_DISABLE");
      const char* shm = std::getenv("NCCL_SHM_DISABLE");
      std::printf(
          "{\"bench\": \"zero3_comm\", \"ranks\": %d, \"NCCL_P2P_DISABLE\": \"%s\", "
          "\"NCCL_SHM_DISABLE\": \"%s\", \"all_gather_bytes_per_step\": %zu, "
          "\"reduce_scatter_bytes_per_step\": %zu, \"comm_ms_per_step\": %.2f}\n",
          ranks, p2p ? p2p : "", shm ? shm : "", 2 * gathered_bytes, reduced_bytes, ms);
    }
    units.clear();
    nccl.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_zero3_comm: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
