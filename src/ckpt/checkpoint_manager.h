// Saves and resumes a training run by asking each of its parts for its state (core/stateful.h):
// named tensors, row-sharded or replicated, and small values for the manifest. It knows the
// files (CheckpointDir), the agreement of the ranks (a step is committed when every rank's
// file is on disk, and resumed only when every rank can read its rows), the fallback to an
// older step when the newest is unusable, and pruning; it knows nothing of what the tensors
// mean, so a new optimizer or stateful part needs no checkpoint code.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_dir.h"
#include "core/stateful.h"

namespace frugal {

class RankFileChecker;  // ckpt/step_check.h

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
  // `staging`: where the host copies of an asynchronous save live (pinned host memory on a GPU),
  // allocated here and reused by every save; null: saves are synchronous. Every rank must choose
  // alike. `rank` of `world_size`: the rank files. Under hybrid sharding they are the ranks of
  // one replica, and `replica` says which replica this rank is in: the ranks of replicas past the
  // first hold the same rows as the first's, so they write nothing, but read their rows and take
  // part in every agreement like the others (`agree` is over every rank).
  CheckpointManager(CheckpointDir dir, int rank, int world_size, AllRanksAgree agree,
                    std::vector<Part> parts, int64_t keep, Arena* staging = nullptr,
                    int replica = 0);
  ~CheckpointManager();  // a save still in flight is waited for (its error is only logged)
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Saves `step`: every part's tensors copied into host memory, then this rank's file written,
  // and once every rank's is on disk, rank 0 commits the step (LATEST) and prunes. Synchronous:
  // all of it before returning. Asynchronous: returns once the copies are made; a thread of its
  // own writes the file and a later poll() or finish() commits. One save at a time: a save while
  // the previous one is in flight waits for it first, and says so. An Error on any rank is an
  // Error on every rank (at the save, or at the poll that finds it), and the previous committed
  // step stays.
  void save(int64_t step);
  // Every step, on every rank: commits an asynchronous save that every rank has written (a
  // collective while one is in flight, nothing otherwise).
  void poll();
  // Waits for the save in flight and commits it: at the end of a run and before it stops.
  void finish();
  bool in_flight() const;

  // What the last commit took, once, for the metrics: the step, this rank's bytes, the seconds
  // of the copies into host memory (what an asynchronous save costs the training), and those
  // from the end of the copies to the file on disk.
  struct Committed {
    int64_t step = 0;
    size_t bytes = 0;
    double stage_seconds = 0;
    double write_seconds = 0;
  };
  std::optional<Committed> take_committed();
  // This rank's bytes of state (as fp32): what a save writes and an asynchronous one stages.
  static size_t state_bytes(const std::vector<Part>& parts, int rank);
  bool asynchronous() const { return staging_ != nullptr; }

  // Loads `step` into the parts (an Error when this rank cannot: a missing or damaged file,
  // a tensor of another shape, a part's values refused). It trusts HDF5 with the files:
  // resume() checks them in child processes first.
  void load(int64_t step);
  // The same with rank 0's manifest already read (by check_step); the files opened are still
  // checked against it (CheckpointDir::open_rank).
  void load(int64_t step, const nlohmann::json& rank0_manifest);
  // Gives each part its values from `manifest` (an Error naming `where` and the part when one
  // refuses them or is missing; a value of the wrong JSON type throws nlohmann's type_error,
  // which resume() reports as a malformed manifest).
  static void load_values(const std::vector<Part>& parts, const nlohmann::json& manifest,
                          const std::string& where);
  // Loads the newest committed step that every rank can read, falling back to older committed
  // steps (naming why each newer one is unusable); 0 when there is none. Before a step is
  // loaded its files are read through in child processes (check_step, each rank a share), so
  // that a file that makes HDF5 crash only makes the step unusable. Warns when LATEST is
  // missing or damaged (the committed steps come from their directories). An Error when
  // committed steps exist but none can be read; the files are kept. `before_step`: only steps
  // below it (a rollback past a step whose weights may already be damaged). `checker`: the
  // child process that reads the files (null: one of its own, forked once for this resume and
  // ended with it; a caller that resumes again and again, like the fuzz target, passes one).
  int64_t resume(int64_t before_step = INT64_MAX, RankFileChecker* checker = nullptr);
  // For a run that does not resume: when the directory holds committed or partial steps of an
  // earlier run, rank 0 moves them aside (CheckpointDir::set_aside) and says where, so that
  // this run's steps neither overwrite nor mix with them. Collective.
  void start_afresh();

  const CheckpointDir& dir() const { return dir_; }

 private:
  struct Write;  // one rank file on its way to disk
  // Host fp32 copies of every part's tensors (into the reused staging buffers when asynchronous)
  // and the manifest.
  void stage(int64_t step, Write& write);
  // Every rank's file is on disk (or not): commit by agreement, or an Error on every rank.
  void commit(Write& write);

  CheckpointDir dir_;
  int rank_, world_size_;
  bool writes_;  // this rank's replica writes the rank files (the first one)
  bool leader_;  // rank 0 of the first replica: commits, indexes, prunes
  AllRanksAgree agree_;
  std::vector<Part> parts_;
  int64_t keep_;
  Arena* staging_;
  std::map<std::string, Tensor> staging_buffers_;  // by state tensor name
  std::unique_ptr<Write> in_flight_;
  std::optional<Committed> committed_;
};

}  // namespace frugal
