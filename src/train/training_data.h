// What a run learns from in its token files: the targets data.train_on selects, checked and
// told at the start (trained tokens, windows without any, documents longer than a window).
#pragma once

#include <cstdint>
#include <string>

#include "data/sampler.h"
#include "data/token_file.h"
#include "train/train_config.h"

namespace frugal {

struct TrainingTargets {
  TargetSelection train, val;
};

// The targets of `train` and `val` (the files of c.data.dir) that c.data.train_on trains.
// Throws Error naming the file when the mode does not apply to what a file holds, or when the
// training file has no target to train. Logs what is trained on (on `log_rank` 0 only).
TrainingTargets select_training_targets(const TrainConfig& c, const TokenFile& train,
                                        const TokenFile& val, int log_rank);

}  // namespace frugal
