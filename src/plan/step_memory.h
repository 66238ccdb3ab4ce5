// The memory one rank of a training run will need, predicted from the structure of the
// computation: the state of every parameter by technique (plan/memory_plan.h's layout), the
// activations each checkpoint policy keeps per layer, the working set of one block's backward,
// the units ZeRO-3 has in flight, and what the GPU's caching allocator keeps.
//
// The allocator (core/device.cpp's CachingArena) rounds a request to a size class and caches a
// freed block for the next request of exactly that class; without a cap it never returns one.
// So its peak reservation is the sum over size classes of the most blocks of that class in use
// at once, even when those maxima fall in different phases of the step. The model lists the
// tensors live in each phase that can hold a class's maximum (start-up, the loss, the backward
// of the last block, of a middle block) and sums the classes' maxima: that is `device_reserved`,
// what metrics.jsonl reports as device_peak_bytes. Under a cap (parallel.gpu_mem_limit) the
// allocator frees its cache when a block would not fit, so a run fits when `device_in_use`
// does.
#pragma once

#include <cstddef>
#include <string>

#include "config/train_config.h"
#include "plan/plan_cluster.h"

namespace frugal {

// Where the bytes at the peak go (GPU, per rank), for the plan's table.
enum class MemoryPart {
  state,        // master weights, gradients, moments, bf16 copies, 4-bit codes kept on the GPU
  activations,  // what the checkpoint policy keeps for the backward, every layer
  block_work,   // the block in the backward: its recomputation and its gradients' temporaries
  gathered,     // ZeRO-3's units in flight: gathered weights, whole gradients, uploads
  dequantized,  // 4-bit projections made bf16 one at a time (one cached block per shape)
  loss,         // the head's chunks of logits and their gradients
  ring,         // ring attention's K/V buffers and dK/dV accumulators (cp > 1)
  start_up,     // frozen fp32 masters of start-up, cached by the allocator
  galore,       // GaLore's temporaries in the optimizer's step (optim/galore_memory.h)
  count
};
const char* memory_part_name(MemoryPart part);

struct MemoryEstimate {
  size_t device_reserved = 0;  // the caching allocator's peak reservation, per GPU
  size_t device_in_use = 0;    // the peak of the bytes in use, per GPU
  size_t parts[size_t(MemoryPart::count)] = {};  // of device_reserved, by what holds them
  // Per rank, in host memory: the offloaded state (pinned) and the asynchronous checkpoint's
  // staging copy (pinned, ckpt.async).
  size_t host_state = 0;
  size_t host_staging = 0;
  // The blocks' inputs under train.activation_offload = inputs (pinned).
  size_t host_activations = 0;

  size_t part(MemoryPart p) const { return parts[size_t(p)]; }
  size_t host() const { return host_state + host_staging + host_activations; }
};

// The run as `config` says (train.type, optim.*, galore.rank, parallel.offload, train.seq_len,
// micro_batch_size, activation_checkpointing, activation_offload, mlp_chunk_tokens,
// loss_chunk_tokens, lora.*) on a GPU, ZeRO-3 over mesh.shard ranks.
MemoryEstimate estimate_memory(const TrainConfig& config, const MeshShape& mesh);

}  // namespace frugal
