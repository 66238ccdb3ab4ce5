// What a run learns from in its token files: the targets data.train_on selects and the windows
// data.packing makes, checked and told at the start (trained tokens, windows without any,
// documents longer than a window, how full the packed windows are).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/train_config.h"
#include "data/packing.h"
#include "data/sampler.h"
#include "data/token_file.h"

namespace frugal {

struct TrainingData {
  TargetSelection train_targets, val_targets;
  Packing packing = Packing::windows;  // data.packing, auto resolved
  // The windows of documents and pad (null for windows, the sampler's own stride).
  std::unique_ptr<PackedWindows> train_windows, val_windows;
};

// The targets of `train` and `val` (the files of c.data.dir) that c.data.train_on trains, in the
// windows c.data.packing makes of them. Throws Error naming the file when a mode does not apply
// to what a file holds, or when the training file has no target to train. Logs what is trained
// on (on `log_rank` 0 only).
TrainingData training_data(const TrainConfig& c, const TokenFile& train, const TokenFile& val,
                           int log_rank);

}  // namespace frugal
