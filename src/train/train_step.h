// One optimizer step over a list of micro-batches, on any ParameterProvider and any number
// of data-parallel ranks: the gradients are those of the mean loss over every counted token
// of every rank's micro-batches.
#pragma once

#include <vector>

#include "dist/comm.h"
#include "model/llama_model.h"
#include "optim/adamw.h"

namespace frugal {

struct StepResult {
  double loss = 0;       // mean over the global batch's counted tokens
  int64_t tokens = 0;    // counted tokens, all ranks
  double grad_norm = 0;  // before clipping
};

// `comm` sums across data-parallel ranks; nullptr means this rank alone.
StepResult train_step(LlamaModel& model, ParameterProvider& params, AdamW& optimizer,
                      const std::vector<Batch>& micro_batches, Comm* comm, double lr, int64_t step,
                      CheckpointPolicy policy);

}  // namespace frugal
