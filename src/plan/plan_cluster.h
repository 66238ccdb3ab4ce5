// What `frugal plan` plans for: the machines (GPUs per node, nodes, memories, links), how the
// ranks are arranged over them, and the measured figures its step-time model stands on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace frugal {

// --- measured constants (doc/benchmarks.md); each is stated once, here -------------------
// The throughput of a whole training step on one H200, in model FLOPs per second: TinyLlama-
// 1.1B, 4 x 2048 tokens, no checkpointing, 65,784 tokens/s = MFU 44.9 % of the dense bf16 peak
// (989.4 TFLOP/s), counting 6 N + 6 L H S FLOPs per token as the benchmark does. It holds the
// GEMMs, attention, the elementwise kernels and the optimizer kernel of a real step, so it is
// the figure a step's compute time is divided by (other GPUs: --gpu-tflops).
constexpr double kMeasuredH200StepFlops = 0.449 * 989.4e12;
// Pinned host <-> H200 copies: the asynchronous checkpoint's staging copy, 13.2 GB in 0.249 s
// (52.8 GB/s, doc/benchmarks.md "Checkpoint saves"); the way offloaded gradients and copies go.
constexpr double kMeasuredH200HostLinkBytesPerS = 52.8e9;
// What offloading the state adds to a step, per trainable weight of a rank: the host's share
// (the global norm over the downloaded fp32 gradients, AdamW, rounding the copies, the pinned
// transfers' completion) that the GPU waits for. Measured on one H200 with 32 host threads,
// TinyLlama-1.1B, full checkpointing: 0.445 s a step with offload = optimizer (18,410 tokens/s)
// against 0.1567 s without (52,266 tokens/s; doc/benchmarks.md "Offload" and "one H200"), over
// 1.1 B weights. A host with
// fewer threads per rank is slower (two ranks of 16 threads measured 0.53 s: see doc/plan.md).
constexpr double kMeasuredOffloadHostSecondsPerWeight = (0.445 - 0.1567) / 1.1e9;

// Machines: GPUs per node, nodes, and the links between them (NCCL bus bandwidths, as
// nccl-tests reports them: a collective over P ranks moving B bytes of whole tensor takes
// B (P - 1) / P / bandwidth).
struct Cluster {
  int64_t gpus_per_node = 1;
  int64_t nodes = 1;
  size_t gpu_mem_bytes = 0;           // per GPU (0: unknown, nothing is refused for it)
  size_t host_mem_bytes = 0;          // per node (0: unknown)
  double link_intra_bytes_per_s = 0;  // between the GPUs of a node
  double link_inter_bytes_per_s = 0;  // between nodes (one node's share of the network)
  double gpu_flops = kMeasuredH200StepFlops;
  double host_link_bytes_per_s = kMeasuredH200HostLinkBytesPerS;

  int64_t ranks() const { return gpus_per_node * nodes; }
};

// How ZeRO-3 spreads over the ranks: flat (every rank one shard group: the weights are gathered
// over the slowest link), or hybrid (HSDP: a node's ranks are a shard group, the nodes replicas
// whose gradient shards are all-reduced once a step).
enum class MeshKind { flat, hybrid };

struct MeshShape {
  int64_t shard = 1;     // ranks in a shard group (dp_shard x cp): ZeRO-3 divides state by it
  int64_t replicas = 1;  // shard groups (dp_replicate)
  int64_t cp = 1;        // context-parallel ranks (inside a shard group)
  bool shard_spans_nodes = false;  // a flat mesh over several nodes

  int64_t ranks() const { return shard * replicas; }
};

MeshShape mesh_shape(const Cluster& cluster, MeshKind kind, int64_t cp);

// "25GB/s", "2.5 GB/s", "900MB/s", "10Gb/s" (bits) as bytes per second; throws Error naming
// the option.
double parse_bandwidth(const std::string& text, const std::string& option);

}  // namespace frugal
