// Saves and resumes a training run by asking each of its parts for its state (core/stateful.h):
// named tensors, row-sharded or replicated, and small values for the manifest. It knows the
// files (CheckpointDir), the agreement of the ranks (a step is committed when every rank's
// file is on disk, and resumed only when every rank can read its rows), the fallback to an
// older step when the newest is unusable, and pruning; it knows nothing of what the tensors
// mean, so a new optimizer or stateful part needs no checkpoint code.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint_dir.h"
#include "core/stateful.h"

namespace frugal {

// The ranks' agreement: true when `ok` holds on every rank. A collective (an all-reduce over
// the communicator; `[](bool ok) { return ok; }` on one process): every rank calls it the same
// number of times, so it also orders the ranks like a barrier.
using AllRanksAgree = std::function<bool(bool ok)>;

class CheckpointManager {
 public:
  struct Part {
    std::string name;  // its values' key in the manifest ("model", "sampler", ...)
    Stateful* state;
  };
  // Every rank builds the same parts in the same order. `keep`: committed steps kept.
  CheckpointManager(CheckpointDir dir, int rank, int world_size, AllRanksAgree agree,
                    std::vector<Part> parts, int64_t keep);

  // Writes this rank's file of `step`; once every rank has, rank 0 commits it (LATEST) and
  // prunes. An Error on any rank is an Error on every rank, and the previous step stays.
  void save(int64_t step);
  // Loads `step` into the parts (an Error when this rank cannot: a missing or damaged file,
  // a tensor of another shape, a part's values refused). It trusts HDF5 with the files:
  // resume() checks them in child processes first.
  void load(int64_t step);
  // Loads the newest committed step that every rank can read, falling back to older committed
  // steps (naming why each newer one is unusable); 0 when there is none. Before a step is
  // loaded its files are read through in child processes (check_step, each rank a share), so
  // that a file that makes HDF5 crash only makes the step unusable. Warns when LATEST is
  // missing or damaged (the committed steps come from their directories). An Error when
  // committed steps exist but none can be read; the files are kept.
  int64_t resume();
  // For a run that does not resume: when the directory holds committed or partial steps of an
  // earlier run, rank 0 moves them aside (CheckpointDir::set_aside) and says where, so that
  // this run's steps neither overwrite nor mix with them. Collective.
  void start_afresh();

  const CheckpointDir& dir() const { return dir_; }

 private:
  CheckpointDir dir_;
  int rank_, world_size_;
  AllRanksAgree agree_;
  std::vector<Part> parts_;
  int64_t keep_;
};

}  // namespace frugal
