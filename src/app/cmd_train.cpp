// `frugal train`: parse the configuration, run the loop.
#include <cstdlib>
#include <iostream>

#include "app/commands.h"
#include "app/options.h"
#include "config/config_keys.h"
#include "core/log.h"
#include "train/trainer.h"

namespace frugal {

int cmd_train(const std::vector<std::string>& args) {
  TrainOptions options = parse_train_options(args);
  if (options.help) {
    std::cout << train_options_help();
    return 0;
  }
  if (options.help_keys_markdown) {
    std::cout << config_keys_markdown();
    return 0;
  }
  // SIGUSR1, SIGTERM and a first SIGINT stop the run after a step, with a checkpoint. The
  // handlers were installed before MPI started (run_frugal), and the flag holds any signal
  // since; installed again here in case MPI's start-up set handlers of its own.
  const std::atomic<int>& stop_signal = install_stop_signal_handlers();
  // Environment switches are read here, once, into the run's options.
  const TrainSummary summary = run_training(
      options.config, parse_fault_injection(std::getenv("FRUGAL_INJECT_FAULT")), &stop_signal);
  return summary.stopped_by_signal ? kStoppedBySignalExitCode : 0;
}

}  // namespace frugal
