// What a run's state will take on each rank, worked out from the parameter table before any of
// it is allocated, so that a model too large for the machine is refused at once with the
// figures, instead of growing host memory until the system kills something. A lower bound:
// activations and allocator slack come on top.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "model/llama_config.h"
#include "optim/galore_adamw.h"

namespace frugal {

struct MemoryPlan {
  // Per rank, by kind, as the run's arenas will count them.
  size_t params = 0;     // master shards (and frozen weights as stored: fp32, or 4-bit parts)
  size_t grads = 0;      // gradient shards of the trainable weights
  size_t optimizer = 0;  // AdamW's two moments (GaLore: its projected moments and projectors)
  size_t copies = 0;     // GPU: the bf16 copies the ranks gather (4-bit codes of frozen weights)
  size_t gathered = 0;   // two units whole: weights in the compute dtype and fp32 gradients
  size_t activation_inputs = 0;  // train.activation_offload = inputs: the blocks' inputs (host)
  // One rank with FP8 weight gathers: every such weight's E4M3 codes, kept for the step (one
  // byte each; Zero3Parameters casts them once a step).
  size_t fp8_codes = 0;
  // GaLore: what its temporaries hold at once where the gradients are (the GPU without offload,
  // else the host), and the float64 host copies its refreshes factorise (optim/galore_memory.h).
  size_t galore_working = 0, galore_host = 0;
  // ckpt.async: the host fp32 copies of master weights and moments a save stages (pinned on a
  // GPU). Not in `host`: the run stages only when they fit, else its saves are synchronous.
  size_t checkpoint_staging = 0;
  // Where they land: host memory (the CPU backend, or offloaded state) and the GPU.
  size_t host = 0, device = 0;
};

struct PlanSettings {
  int ranks = 1;
  bool gpu = false;
  Offload offload = Offload::none;
  StateDType state = StateDType::fp32;          // the moments' dtype (optim.state_dtype)
  MasterDType master = MasterDType::automatic;  // the masters' and gradients' (optim.master_dtype)
  std::function<bool(const ParamSpec&)> four_bit;  // frozen weights stored in 4 bits (QLoRA)
  bool four_bit_hqq = false;  // their format: NF4 (false) or HQQ (scale and zero per 64)
  std::function<bool(const ParamSpec&)> fp8_gathered;  // trained weights gathered as E4M3 codes
  std::optional<GaloreConfig> galore;  // GaLore's settings (none: AdamW on every weight)
  size_t activation_inputs = 0;        // offloaded activations (offloaded_input_bytes), host memory
  bool checkpoint_staging = false;     // CkptConfig::stages_saves()
};

MemoryPlan plan_memory(const std::vector<UnitSpec>& units, const PlanSettings& settings);

// GaLore's settings from the config's [galore] keys: what the run's optimizer gets and what the
// plans count its memory by.
GaloreConfig galore_config(const TrainConfig& config);

// The rows of one micro-batch on a rank of `cp` context-parallel ranks: its share of each
// sequence, padded to 2 cp chunks (ring_attention.h's zigzag layout).
int64_t local_tokens(const TrainConfig& config, int64_t cp);
// The host memory train.activation_offload = inputs holds on a rank at the end of a forward:
// every block's input but the last, [local tokens, hidden] in the compute dtype (bf16 on a GPU,
// f32 on the CPU); 0 without it.
size_t offloaded_input_bytes(const TrainConfig& config, int64_t cp, bool gpu);

// The trained weights a run gathers as E4M3 codes (FP8 weight gathers, zero3_parameters.h): in
// full training under delayed scaling, the block projections fp8.linears names, whose shard of
// ceil(rows / shard_ranks) rows has rows and columns in multiples of 16 on a GPU (cuBLASLt's
// FP8 layouts; the others are gathered in bf16). Null without FP8 weight gathers.
std::function<bool(const ParamSpec&)> fp8_gathered_weights(const TrainConfig& config,
                                                           int64_t shard_ranks, bool gpu);

// GaLore's fp32 state of one projected matrix on a rank holding shard_rows of its rows (its
// moments and its projector; see optim/galore_adamw.h for the sides).
size_t galore_state_bytes(const Shape& shape, size_t shard_rows, int64_t rank,
                          bool int8_state = false);

// What an asynchronous save stages on the host for one trainable shard of `shard` elements: its
// master and its optimizer state (`optimizer_bytes` as held, `master_bytes` per element), in
// fp32 (GaLore's state is fp32 already).
inline size_t checkpoint_staging_bytes(size_t shard, size_t staged_optimizer_bytes) {
  return shard * 4 + staged_optimizer_bytes;
}

// The optimizer state of one trained parameter of (whole) `shape` on a rank holding shard_rows
// of its rows: AdamW's two moments of `moment` bytes a value (optim.state_dtype fp32 or bf16), or with optim.state_dtype = int8
// (where int8_moments_apply) a byte a value and an f32 absmax per block of 256 values within a
// row; GaLore's projected moments (8-bit the same way) and projector where galore_rank > 0 and
// GaLore projects it. `staged`: what a checkpoint stages of it (every tensor as f32).
struct OptimizerStateBytes {
  size_t held = 0, staged = 0;
};
OptimizerStateBytes optimizer_state_bytes(const std::string& name, const Shape& shape,
                                          size_t shard_rows, size_t moment, StateDType state,
                                          int64_t galore_rank);

// A floor under a run's memory on one rank, from the configuration's size keys alone, worked
// out before the parameter table exists (the table of a billion layers would fill the host by
// itself) in arithmetic that saturates instead of wrapping: a part past 2^64 bytes is
// SIZE_MAX. Each part names the keys it grows with and their values, so that a run no node
// can hold is refused by the key that made it so (check_memory_floor).
struct MemoryFloorPart {
  std::string what;  // "the blocks' weights and their training state: model.num_hidden_layers
                     // = 1000000000 blocks x 49408 parameters (model.hidden_size = 64, ...)"
  size_t bytes = 0;
  bool on_device = false;  // the GPU's memory on a GPU run; else host memory
};
// The parts for `config` on a rank of `shard_ranks` ZeRO-3 ranks and `cp` context-parallel
// ranks, on GPUs or the CPU: the state of every weight (master, gradient and moments of the
// trained ones, the frozen ones as stored), LoRA's adapters, the blocks' inputs kept for the
// backward, the loss's chunk of logits, the MLP's and attention's widest tensors, FP8's amax
// histories, and the parameter table itself.
std::vector<MemoryFloorPart> memory_floor(const TrainConfig& config, int64_t shard_ranks,
                                          int64_t cp, bool gpu);
// Throws Error when the floor cannot fit: its host parts times the node's ranks beyond
// `available_host` (0: unknown), its device parts beyond `device_bytes` (0: no GPU or
// unknown), or any part past 2^64 bytes. The message leads with the largest part and its
// keys.
void check_memory_floor(const std::vector<MemoryFloorPart>& parts, size_t node_ranks,
                        size_t available_host, size_t device_bytes);

// "parameters 1.20 GiB, gradients ..., optimizer ..." of the non-zero kinds.
std::string describe(const MemoryPlan& plan);
std::string gib(size_t bytes);  // "1.20 GiB", or "3.00 MiB" below a GiB

}  // namespace frugal
