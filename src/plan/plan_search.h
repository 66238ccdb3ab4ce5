// `frugal plan`'s choice: every combination of techniques the run could use (checkpoint policy,
// state dtype, GaLore, LoRA's base in bf16 or 4 bits, offload, flat or hybrid sharding), each
// with its predicted memory (step_memory.h) and step time (step_time.h), and the cheapest one
// that fits: the fastest, and among options within 1 % of it the one that changes the training's
// arithmetic least (fp32 state before bf16, AdamW before GaLore, a bf16 base before a 4-bit one).
#pragma once

#include <string>
#include <vector>

#include "config/train_config.h"
#include "plan/plan_cluster.h"
#include "plan/step_memory.h"
#include "plan/step_time.h"

namespace frugal {

struct PlanOption {
  TrainConfig config;  // the run's settings with this option's techniques
  MeshKind mesh_kind = MeshKind::flat;
  MeshShape mesh;
  MemoryEstimate memory;
  StepTime time;
  size_t host_per_node = 0;  // every rank of a node together
  bool fits_gpu = false, fits_host = false;
  int arithmetic_changes = 0;  // bf16 state, GaLore, a 4-bit base: each counts one
  std::string verdict;         // why it was picked or rejected

  bool fits() const { return fits_gpu && fits_host; }
  std::string techniques() const;  // "full, adamw fp32, selective, offload none, flat"
};

struct Plan {
  std::vector<PlanOption> options;  // the pick first, then fitting ones by step time, then the rest
  bool found = false;               // options[0] fits
};

// base: the run as configured (its shape, sequence, batch, train.type, lora.*, galore.*, cp);
// the techniques are varied around it. Full training stays full training (LoRA would train
// something else); lora, qlora and hqq_lora are alternatives to one another.
Plan make_plan(const TrainConfig& base, const Cluster& cluster);

}  // namespace frugal
