// The training loop of one configuration: resume, steps, evaluation, metrics, checkpoints, and
// a sample at the end (the run's parts are assembled by training_run.h).
#pragma once

#include <cstdint>

#include "config/train_config.h"
#include "train/fault_injection.h"
#include "train/health_monitor.h"
#include "train/stop_signals.h"

namespace frugal {

struct TrainSummary {
  int64_t steps_done = 0;
  double first_val_loss = 0;  // of the initial model (or at resume)
  double final_val_loss = 0;
  double tokens_per_s = 0;  // training tokens per second, all ranks together
  // The signal (SIGUSR1 or SIGTERM) that stopped the run early, its checkpoint committed;
  // 0 when the run reached train.steps (or had nothing to train).
  int stopped_by_signal = 0;
  HealthCounts health;  // what the guards did
};

// `fault`: the testing aid of FRUGAL_INJECT_FAULT (none by default). `stop_signal`: the flag of
// install_stop_signal_handlers(); once it is non-zero on any rank, the run stops after the step
// in progress with a checkpoint (nullptr: only train.steps ends the run).
TrainSummary run_training(const TrainConfig& config, const FaultInjection& fault = {},
                          const std::atomic<int>* stop_signal = nullptr);

}  // namespace frugal
