// The memory of a training run on this rank: one arena per kind of state, so that the
// per-rank accounting is exact, on the CPU or inside one capped GPU arena (and pinned host
// memory when offloaded); and the report of what each holds.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "config/train_config.h"
#include "core/device.h"
#include "core/tensor.h"
#include "parallel/comm.h"

namespace frugal {

// Where each kind of state lives; separate arenas make the per-rank accounting exact.
// On the CPU each is its own arena in host memory (offloaded state is the same memory, counted
// apart, as it is on a GPU). On a GPU each is an accounting domain inside the one capped device
// arena, or inside pinned host memory when offloaded; activations go to the device arena.
struct RunMemory {
  RunMemory(const ParallelConfig& p, bool use_gpu, int local_rank);
  ~RunMemory();
  RunMemory(const RunMemory&) = delete;
  RunMemory& operator=(const RunMemory&) = delete;
  Arena& activations();
  // On a GPU every state arena is a part of the device or pinned arena, which count it all.
  size_t peak_bytes();
  nlohmann::json report();

#ifdef FRUGAL_HAVE_CUDA
  std::unique_ptr<DeviceContext> gpu;  // first member: outlives every arena inside it
#endif
  std::unique_ptr<Arena> params, grads, optimizer, gathered, copies;
  // Host copies of the state for asynchronous checkpoints (pinned on a GPU), reused by each save.
  std::unique_ptr<Arena> staging;
  // The blocks' inputs under train.activation_offload = inputs (pinned host memory on a GPU).
  std::unique_ptr<Arena> activation_inputs;
};

// Whether the ranks run on GPUs, one each: `device` cuda demands it (throws Error starting
// with `what`, e.g. "config key 'parallel.device'", when a node has fewer GPUs than ranks),
// auto takes them when every node has enough, cpu never. Collective: every rank decides alike
// (a rank on the CPU and one on a GPU cannot share a model).
bool decide_gpu(DeviceChoice device, Comm& world, const std::string& what);

// "12.34 MiB"
std::string mib(size_t bytes);

}  // namespace frugal
