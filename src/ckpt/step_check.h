// Checking a committed step's files before anything trusts them: each rank file is read through
// (its manifest against rank 0's, every tensor's checksums) in a child process, so that a
// damaged file that makes HDF5 crash or hang is reported by name ("damaged: HDF5 crashed
// reading it") instead of taking the reader down. `frugal ckpt verify` and resume both use it,
// so they accept and refuse the same steps.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint_dir.h"

namespace frugal {

struct RankFileCheck {
  int rank = 0;
  std::string path;
  std::string error;  // empty when the file is sound
  int64_t tensors = 0, bytes = 0;
};

struct StepCheck {
  int64_t step = 0;
  int world_size = 0;                // 0 when rank 0's manifest could not be read
  nlohmann::json manifest;           // rank 0's
  std::vector<RankFileCheck> files;  // the files checked, in rank order
  std::string error;                 // the first problem, naming its file; empty when sound
  bool ok() const { return error.empty(); }
};

// Checks rank 0's manifest, then the rank files of `step` whose rank r has r % stride == first
// (every file with the defaults; the ranks of a resume each take a share, so that every file
// is read once). Each file is read in its own child process, given dir.check_time_limit()
// before it counts as hung.
StepCheck check_step(const CheckpointDir& dir, int64_t step, int first = 0, int stride = 1);

}  // namespace frugal
