// The training loop: data, model, optimizer, schedule, evaluation, metrics, checkpoints and
// resume, for one configuration.
#pragma once

#include <cstdint>

#include "train/train_config.h"

namespace frugal {

struct TrainSummary {
  int64_t steps_done = 0;
  double first_val_loss = 0;  // of the initial model (or at resume)
  double final_val_loss = 0;
  double tokens_per_s = 0;  // training tokens per second, all ranks together
};

TrainSummary run_training(const TrainConfig& config);

}  // namespace frugal
