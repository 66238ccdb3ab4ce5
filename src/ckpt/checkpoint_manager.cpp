// Save with commit by agreement, load by rows, resume with fallback.
#include "ckpt/checkpoint_manager.h"

#include <filesystem>

#include "ckpt/sharded_reader.h"
#include "ckpt/step_check.h"
#include "core/log.h"
#include "ops/ops.h"

namespace frugal {

CheckpointManager::CheckpointManager(CheckpointDir dir, int rank, int world_size,
                                     AllRanksAgree agree, std::vector<Part> parts, int64_t keep)
    : dir_(std::move(dir)),
      rank_(rank),
      world_size_(world_size),
      agree_(std::move(agree)),
      parts_(std::move(parts)),
      keep_(keep) {}

void CheckpointManager::save(int64_t step) {
  // Every part first settles (a host optimizer may still be updating the weights and moments
  // it shares with other parts), then any part's tensors are read.
  for (Part& p : parts_) p.state->before_save();
  std::vector<NamedTensor> tensors;
  nlohmann::json manifest = {
      {"format", "frugal-checkpoint-2"},
      {"step", step},
      {"world_size", world_size_},
      {"rank", rank_},
      {"layout", "rows of each tensor split over the ranks in blocks of ceil(rows / world_size)"}};
  for (Part& p : parts_) {
    const nlohmann::json values = p.state->state_values();
    if (!values.is_null()) manifest[p.name] = values;
    for (const StateTensor& t : p.state->state_tensors())
      // A replicated tensor is the same on every rank: rank 0's file holds it.
      if (!t.rows.replicated || rank_ == 0)
        tensors.push_back({t.name, ops::to_host_f32(t.tensor)});  // fp32 host copies
  }
  std::string error;
  try {
    dir_.save_rank(step, rank_, tensors, manifest);
  } catch (const Error& e) {
    error = e.what();
  }
  // Commit only when every rank has its file on disk; otherwise the previous step stays.
  const bool all_saved = agree_(error.empty());
  if (!error.empty()) fail("checkpoint of step ", step, " failed: ", error);
  if (!all_saved) fail("checkpoint of step ", step, " failed on another rank (see its message)");
  if (rank_ == 0) dir_.commit(step, world_size_, keep_);
  agree_(true);  // no rank goes on (and may save again) before the commit
}

void CheckpointManager::load(int64_t step) {
  const nlohmann::json manifest = dir_.manifest(step);
  for (Part& p : parts_)
    if (manifest.contains(p.name)) {
      try {
        p.state->load_state_values(manifest.at(p.name));
      } catch (const Error& e) {
        fail("checkpoint step ", step, " in '", dir_.step_dir(step), "': ", e.what());
      }
    } else if (!p.state->state_values().is_null()) {
      fail("checkpoint step ", step, " in '", dir_.step_dir(step), "' has no '", p.name,
           "' in its manifest");
    }
  // This rank's rows of every tensor, whatever the number of ranks that saved them; a
  // replicated tensor whole from rank 0's file.
  ShardedTensorReader sharded(dir_, step, manifest.at("world_size").get<int>(), manifest);
  ShardedTensorReader first_file(dir_, step, 1, manifest);
  for (Part& p : parts_)
    for (StateTensor& t : p.state->state_tensors()) {
      const RowShard& r = t.rows;
      if (r.last_row == r.first_row) continue;  // only padding on this rank
      ShardedTensorReader& reader = r.replicated ? first_file : sharded;
      Tensor rows = t.tensor.rows(0, r.last_row - r.first_row);
      // Checkpoints hold fp32 (a bf16 run's values widen exactly and narrow back unchanged).
      ops::assign(
          rows, reader.read_rows(t.name, r.full_shape, r.first_row, r.last_row).view(rows.shape()));
    }
  for (Part& p : parts_) p.state->after_load();
}

int64_t CheckpointManager::resume() {
  if (rank_ == 0) dir_.remove_pruned_leftovers();
  const std::vector<int64_t> steps = dir_.committed_steps();
  if (steps.empty()) {
    log_info("train.resume: no committed checkpoint under ", dir_.root(),
             ", starting from scratch");
    return 0;
  }
  const std::string pointer = dir_.latest_problem();
  if (!pointer.empty() && rank_ == 0)
    log_warn("train.resume: ", pointer, "; resuming from the newest committed step directory");
  std::string errors;
  for (int64_t step : steps) {
    // Every rank file read through in child processes first (each rank a share), agreed by
    // all, then loaded: a damaged file costs a child, not the run.
    std::string error = check_step(dir_, step, rank_, world_size_).error;
    if (agree_(error.empty())) {
      try {
        load(step);
      } catch (const Error& e) {
        error = e.what();
      } catch (const nlohmann::json::exception& e) {
        error = "checkpoint '" + dir_.step_dir(step) + "' has a malformed manifest: " + e.what();
      }
      // Every rank must resume from the same step: one rank's bad file rules the step out.
      if (agree_(error.empty())) {
        if (!errors.empty()) log_warn("resuming from an older checkpoint because:", errors);
        log_info("resumed from step ", step, " (", dir_.step_dir(step), ")");
        return step;
      }
    }
    const std::string why = error.empty() ? "another rank could not read its file" : error;
    log_warn("checkpoint step ", step, " is unusable: ", why);
    errors += " step " + std::to_string(step) + ": " + why + ";";
  }
  fail("no committed checkpoint under '", dir_.root(), "' can be read:", errors,
       " (the files are kept; start a new out_dir, or fix them)");
}

void CheckpointManager::start_afresh() {
  std::string error, aside;
  if (rank_ == 0) {
    try {
      aside = dir_.set_aside();
    } catch (const Error& e) {
      error = e.what();
    } catch (const std::filesystem::filesystem_error& e) {
      error = e.what();
    }
  }
  const bool ok = agree_(error.empty());
  if (!error.empty()) fail("train.resume = false: ", error);
  if (!ok) fail("train.resume = false: rank 0 could not set the earlier checkpoints aside");
  if (!aside.empty())
    log_warn("train.resume = false, but '", dir_.root(),
             "' held checkpoints of an earlier run: they are moved to '", aside,
             "' (delete them when they are not needed; train.resume = true continues a run)");
}

}  // namespace frugal
