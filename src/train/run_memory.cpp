// The run's arenas and their report.
#include "train/run_memory.h"

#include <cstdio>

#include "core/log.h"
#include "core/slab_arena.h"
#include "ops/ops.h"

namespace frugal {

bool decide_gpu(DeviceChoice device, Comm& world, const std::string& what) {
  const int gpus = device_count(), node_ranks = mpi_node_size();
  const bool enough_gpus = gpus > 0 && gpus >= node_ranks;
  const bool everywhere = world.all_reduce_max(enough_gpus ? 0 : 1) == 0;
  if (device == DeviceChoice::cuda && !everywhere)
    fail(what, ": cuda needs one GPU per rank, but ",
         enough_gpus ? "another node has fewer GPUs than ranks"
                     : "this node has " + std::to_string(node_ranks) + " rank(s) and sees " +
                           std::to_string(gpus) + " GPU(s)",
         kHaveCuda ? "" : " (this frugal was built without CUDA)");
  const bool use_gpu =
      device == DeviceChoice::cuda || (device == DeviceChoice::automatic && everywhere);
  if (device == DeviceChoice::automatic && gpus > 0 && !use_gpu)
    log_warn(what, " = auto: ", node_ranks, " rank(s) on this node but ", gpus,
             " GPU(s), so this runs on the CPU; start one rank per GPU to use them");
  return use_gpu;
}

RunMemory::RunMemory(const ParallelConfig& p, bool use_gpu, int local_rank) {
  const Offload offload = p.offload;
  const std::string host = use_gpu ? " (pinned host, offloaded)" : " (host, offloaded)";
  // On a GPU both offload modes move the fp32 master too (the host optimizer updates it).
  const std::string params_name =
      offload == Offload::params || (use_gpu && offload != Offload::none)
          ? "parameter shards" + host
          : "parameter shards";
  const std::string grads_name =
      offload != Offload::none ? "gradient shards" + host : "gradient shards";
  const std::string optimizer_name =
      offload != Offload::none ? "optimizer state" + host : "optimizer state";
  if (!use_gpu) {
    params = std::make_unique<Arena>(params_name, Device::cpu);
    grads = std::make_unique<Arena>(grads_name, Device::cpu);
    optimizer = std::make_unique<Arena>(optimizer_name, Device::cpu);
    gathered = std::make_unique<Arena>("gathered units", Device::cpu);
    staging = std::make_unique<Arena>("checkpoint staging (host)", Device::cpu);
    activation_inputs = std::make_unique<Arena>("activation inputs (host, offloaded)", Device::cpu);
    return;
  }
#ifdef FRUGAL_HAVE_CUDA
  gpu = std::make_unique<DeviceContext>(local_rank, p.gpu_mem_limit_bytes());
  Arena& device = gpu->device_memory();
  Arena& pinned = gpu->pinned_memory();
  // Offload on a GPU: the fp32 state (master, gradients, moments) in pinned host memory,
  // where AdamW runs on the host; with `params` the bf16 copies too (uploaded when used).
  // The state lives for the run, in many tensors of a few MiB (LoRA's adapters, 4-bit scales):
  // packed into slabs rather than each in a block of the caching arena's 2 MiB steps.
  const bool host_state = offload != Offload::none;
  params = std::make_unique<SlabArena>(params_name, host_state ? pinned : device);
  grads = std::make_unique<SlabArena>(grads_name, host_state ? pinned : device);
  optimizer = std::make_unique<SlabArena>(optimizer_name, host_state ? pinned : device);
  gathered = std::make_unique<SubArena>("gathered units", device);
  copies = std::make_unique<SlabArena>(offload == Offload::params
                                          ? "bf16 weight copies (pinned host, offloaded)"
                                          : "bf16 weight copies",
                                      offload == Offload::params ? pinned : device);
  // Its own pinned arena: the state's memory figures stay what training itself holds.
  staging = std::make_unique<PinnedHostArena>(0, "checkpoint staging (pinned host)");
  activation_inputs =
      std::make_unique<SubArena>("activation inputs (pinned host, offloaded)", pinned);
  ops::bind_device(gpu.get());
#else
  (void)local_rank;
  fail("config key 'parallel.device': this frugal was built without CUDA");
#endif
}
RunMemory::~RunMemory() {
#ifdef FRUGAL_HAVE_CUDA
  if (gpu) ops::bind_device(nullptr);
#endif
}
Arena& RunMemory::activations() {
#ifdef FRUGAL_HAVE_CUDA
  if (gpu) return gpu->device_memory();
#endif
  return host_arena();
}
size_t RunMemory::peak_bytes() {
#ifdef FRUGAL_HAVE_CUDA
  if (gpu) return gpu->device_memory().stats().peak_bytes + gpu->pinned_memory().stats().peak_bytes;
#endif
  return activations().stats().peak_bytes + gathered->stats().peak_bytes +
         params->stats().peak_bytes + grads->stats().peak_bytes + optimizer->stats().peak_bytes;
}
nlohmann::json RunMemory::report() {
  nlohmann::json r = {{"parameters_bytes", params->stats().in_use_bytes},
                      {"gradients_bytes", grads->stats().in_use_bytes},
                      {"optimizer_bytes", optimizer->stats().in_use_bytes},
                      {"gathered_peak_bytes", gathered->stats().peak_bytes},
                      {"checkpoint_staging_bytes", staging->stats().in_use_bytes},
                      {"activation_offload_peak_bytes", activation_inputs->stats().peak_bytes}};
#ifdef FRUGAL_HAVE_CUDA
  if (gpu) {
    // Every device allocation comes from one arena (the parts above are sub-arenas of it): its
    // peak is the device's, reported as device_peak_in_use_bytes, not as the activations'.
    const CachingStats d = gpu->device_memory().caching_stats();
    r["weight_copies_bytes"] = copies->stats().in_use_bytes;
    r["device_peak_bytes"] = d.peak_reserved_bytes;
    r["device_peak_in_use_bytes"] = d.peak_in_use_bytes;
    r["pinned_host_bytes"] = gpu->pinned_memory().stats().in_use_bytes;
    return r;
  }
#endif
  r["activations_peak_bytes"] = activations().stats().peak_bytes;
  return r;
}

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / 1048576.0);
  return buf;
}

}  // namespace frugal
