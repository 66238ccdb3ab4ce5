// The bytes a training step moves over each class of link, and the time a step takes at least,
// from the model's FLOPs at the measured step throughput (plan_cluster.h) and the links'
// bandwidths, with the overlap frugal does: ZeRO-3 gathers one unit ahead and keeps one
// reduce-scatter in flight, on a communication stream beside the compute stream; a hybrid mesh
// all-reduces each rank's gradient shard across the replicas once a step, beside the last
// micro-batch's backward; offloaded gradients come down and copies go up on the same stream,
// and the host AdamW runs beside the next forward.
#pragma once

#include "config/train_config.h"
#include "plan/plan_cluster.h"

namespace frugal {

// Bytes one rank sends per optimizer step (bus bytes: what a ring moves through each rank's
// link), by link class.
struct StepTraffic {
  double intra_node = 0;  // ZeRO-3 gathers and reduce-scatters, the ring's K/V, in a node
  double inter_node = 0;  // across nodes: a flat mesh's gathers, a hybrid mesh's all-reduce
  double host = 0;        // GPU <-> pinned host memory (offload)
};

struct StepTime {
  double compute_s = 0;  // the FLOPs of the step at the measured throughput
  double comm_s = 0;     // every transfer alone, one after the other on the communication stream
  double step_s = 0;     // the bound: compute and transfers overlapped as frugal overlaps them
  double flops = 0;      // model FLOPs per step and rank (recomputation included)
  int64_t tokens = 0;    // tokens per step, all ranks
  StepTraffic bytes;

  double tokens_per_s() const { return step_s > 0 ? double(tokens) / step_s : 0; }
};

StepTime estimate_step_time(const TrainConfig& config, const MeshShape& mesh,
                            const Cluster& cluster);

}  // namespace frugal
