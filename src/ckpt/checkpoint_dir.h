// The checkpoint directory of a run:
//   <root>/step_00001200/rank_00000.h5 ...   each rank's tensors and a JSON manifest
//   <root>/step_00001200/index.h5            virtual datasets over the rank files (h5py)
//   <root>/step_00001200/COMMITTED           written by rank 0 once every rank's file is on
//                                            disk: the step, the number of rank files and
//                                            index.h5's CRC32C
//   <root>/LATEST                            the newest committed step, written last
// A step directory is committed when it holds COMMITTED and every rank file that names;
// anything else (a step whose save was interrupted) is ignored. LATEST is a pointer for
// people and older frugal versions: when it is damaged, empty, missing or names a deleted step,
// the committed steps are still found from their directories. (Steps written before
// COMMITTED existed count as committed when they are at or below a readable LATEST.)
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/h5_file.h"
#include "core/tensor.h"

namespace frugal {

struct NamedTensor {
  std::string name;  // "model/<hf name>", "optim/exp_avg/<hf name>", ...
  Tensor tensor;
};

// The manifest of a rank file: its text (once its checksum is checked) as a JSON object; an
// Error naming `path` otherwise.
nlohmann::json parse_manifest(const std::string& path, const std::string& text);
// The number of ranks that saved the step, from its manifest; an Error naming `path` when it is
// not a plausible one (1 to 2^24).
int manifest_world_size(const std::string& path, const nlohmann::json& manifest);
// A rank file's manifest must be rank 0's (`rank0`) but for its own "rank", and of its
// directory's step; an Error naming `path` and the first disagreement otherwise.
void check_manifest_agrees(const std::string& path, const nlohmann::json& manifest,
                           const nlohmann::json& rank0, int64_t step, int rank);

// A directory where a checkpoint file is about to be renamed into place (damage: a rename cannot
// replace a directory, as it replaces a FIFO or a symlink) is renamed to "<path>.unusable" (or
// "<path>.unusable.2", ...) with a warning, so that the save goes on and nothing of it is
// deleted. Returns that name, or "" when no directory is there.
std::string move_directory_aside(const std::string& path);

class CheckpointDir {
 public:
  explicit CheckpointDir(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  // How long a child process may take to read a rank file through (check_step) before the
  // file counts as one that makes HDF5 hang; 0 (the default): a minute plus a second per 20
  // MB of the file.
  void set_check_time_limit(double seconds) { check_time_limit_s_ = seconds; }
  double check_time_limit(const std::string& rank_file) const;
  // Whether `path` looks like a checkpoint root: it holds LATEST or a step directory.
  static bool holds_checkpoints(const std::string& path);

  std::string step_dir(int64_t step) const;
  std::string rank_file(int64_t step, int rank) const;

  // Writes this rank's file of `step` (atomically: a temporary name, fsync, rename).
  void save_rank(int64_t step, int rank, const std::vector<NamedTensor>& tensors,
                 const nlohmann::json& manifest) const;
  // Marks `step`, saved by `world_size` ranks, committed (its COMMITTED file, with the CRC32C
  // of its index.h5 when it has one, then LATEST),
  // and prunes the committed steps older than the `keep` newest. A pruned step is first
  // renamed to a hidden name (".pruned.step_...") and then deleted, so that a kill during the
  // deletion leaves no half step that looks like one. Called by rank 0 once every rank has
  // saved.
  void commit(int64_t step, int world_size, int64_t keep) const;
  // Every committed step on disk, newest first.
  std::vector<int64_t> committed_steps() const;
  // Step directories marked COMMITTED but missing a rank file it names (or holding something
  // other than a regular file there), and step names on things that are not directories (a
  // symlink loop), newest first, each with what is wrong: committed once, since damaged
  // (`ckpt verify` reports them, resume names them).
  std::vector<std::pair<int64_t, std::string>> incomplete_steps() const;
  // The newest committed step, if any.
  std::optional<int64_t> latest() const;
  // Empty when LATEST names the newest committed step; otherwise what is wrong with it ("...
  // LATEST is missing", "... holds 'x', not a step name", "... names step_00000030, which is
  // not a committed step on disk"), for a warning.
  std::string latest_problem() const;
  // Deletes what interrupted prunes left (the hidden ".pruned.*" directories).
  void remove_pruned_leftovers() const;
  // Renames every entry with a step's name that is not a directory (a symlink loop, a FIFO, a
  // file) to "<name>.unusable" (".unusable.2", ...), which no reader takes for a step, so that a
  // save of that step can make its directory; returns "<old> -> <new>" for each, for a warning.
  // For rank 0 of a resume, after the damaged steps were named.
  std::vector<std::string> move_non_directories_aside() const;
  // Moves every step directory and LATEST into a new <root>/earlier_run_<n>/ and returns its
  // path ("" when there was nothing to move): a run that starts afresh in a directory holding
  // an earlier run's checkpoints keeps them, and does not mix its steps with theirs.
  std::string set_aside() const;

  // The manifest of `step`'s rank file `rank` (its CRC32C checked).
  nlohmann::json manifest(int64_t step, int rank = 0) const;
  // Opens rank `rank`'s file of `step` and checks its manifest: its CRC32C, and that it is
  // rank 0's (`rank0_manifest`) but for its own "rank": the same step (that of the directory),
  // world size, model and parts' values. Every reader of a step opens its files through this,
  // so `ckpt verify`, resume, eval and export apply the same rule.
  H5Reader open_rank(int64_t step, int rank, const nlohmann::json& rank0_manifest) const;

  struct RankSummary {
    int64_t tensors = 0, bytes = 0;
  };
  // Reads all of rank `rank`'s file of `step` back: open_rank's checks, then every tensor
  // (Fletcher32 and CRC32C). An Error naming the file and the dataset on any damage.
  RankSummary verify_rank(int64_t step, int rank, const nlohmann::json& rank0_manifest) const;
  // The same for rank 0's file, opened once: its manifest (into `manifest`; checked against
  // itself as verify_rank checks it), then every tensor.
  RankSummary verify_rank0(int64_t step, nlohmann::json& manifest) const;

  // What `step`'s COMMITTED file says; nullopt for a step written before COMMITTED existed (or
  // without a readable one).
  struct CommitMark {
    int world_size = 0;                    // the number of rank files
    std::optional<uint32_t> index_crc32c;  // of index.h5; none in steps committed before 2026-12-04
  };
  std::optional<CommitMark> commit_mark(int64_t step) const;
  // commit_mark's number of rank files.
  std::optional<int> committed_world_size(int64_t step) const;
  std::string index_file(int64_t step) const;  // <step dir>/index.h5

  // The temporary files (*.tmp) of saves that never finished, e.g. of a writer killed mid-file:
  // the paths of those under the root and its step directories.
  std::vector<std::string> temporary_files() const;

 private:
  std::string root_;
  double check_time_limit_s_ = 0;
};

}  // namespace frugal
