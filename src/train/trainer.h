// The training loop of one configuration: resume, steps, evaluation, metrics, checkpoints, and
// a sample at the end (the run's parts are assembled by training_run.h).
#pragma once

#include <cstdint>

#include "train/fault_injection.h"
#include "train/train_config.h"

namespace frugal {

struct TrainSummary {
  int64_t steps_done = 0;
  double first_val_loss = 0;  // of the initial model (or at resume)
  double final_val_loss = 0;
  double tokens_per_s = 0;  // training tokens per second, all ranks together
};

// `fault`: the testing aid of FRUGAL_INJECT_FAULT (none by default).
TrainSummary run_training(const TrainConfig& config, const FaultInjection& fault = {});

}  // namespace frugal
