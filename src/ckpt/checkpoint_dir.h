// The checkpoint directory of a run:
//   <root>/step_00001200/rank_00000.h5 ...   each rank's tensors and a JSON manifest
//   <root>/LATEST                            the committed step, written last, atomically
// A step directory without LATEST naming it was never committed and is ignored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace frugal {

struct NamedTensor {
  std::string name;  // "model/<hf name>", "optim/exp_avg/<hf name>", ...
  Tensor tensor;
};

class CheckpointDir {
 public:
  explicit CheckpointDir(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }

  std::string step_dir(int64_t step) const;
  std::string rank_file(int64_t step, int rank) const;

  // Writes this rank's file of `step` (atomically: a temporary name, fsync, rename).
  void save_rank(int64_t step, int rank, const std::vector<NamedTensor>& tensors,
                 const nlohmann::json& manifest) const;
  // Names `step` in LATEST (atomic rename) and deletes committed steps older than the
  // `keep` newest. Called by rank 0 once every rank has saved.
  void commit(int64_t step, int64_t keep) const;
  // The committed step, if any; a LATEST that names a missing step is an Error.
  std::optional<int64_t> latest() const;
  // Every committed step still on disk, newest first (LATEST's, then the older ones kept).
  std::vector<int64_t> committed_steps() const;

  struct Loaded {
    nlohmann::json manifest;
    std::vector<NamedTensor> tensors;
  };
  // Reads and checksum-verifies this rank's file of `step`.
  Loaded load_rank(int64_t step, int rank) const;
  // The manifest of `step` (from rank 0's file).
  nlohmann::json manifest(int64_t step) const;

  // The temporary files (*.tmp) of saves that never finished, e.g. of a writer killed mid-file:
  // the paths of those under the root and its step directories.
  std::vector<std::string> temporary_files() const;

 private:
  std::string root_;
};

}  // namespace frugal
