// Save with commit by agreement, load by rows, resume with fallback.
#include "ckpt/checkpoint_manager.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "ckpt/checkpoint_index.h"
#include "ckpt/sharded_reader.h"
#include "ckpt/step_check.h"
#include "core/log.h"
#include "core/regular_file.h"
#include "ops/ops.h"

namespace fs = std::filesystem;

namespace frugal {

// One rank file on its way to disk: host fp32 tensors, the manifest, and what writing made of
// them. An asynchronous save writes it on `thread`; `done` says so to the polling loop.
struct CheckpointManager::Write {
  int64_t step = 0;
  std::vector<NamedTensor> tensors;
  nlohmann::json manifest;
  std::vector<IndexEntry> index;  // rank 0: what index.h5 maps, written after its rank file
  int world_size = 1;
  size_t bytes = 0;
  double stage_seconds = 0;
  std::thread thread;
  std::atomic<bool> done{false};
  std::string error;  // set before done
  double seconds = 0;

  void write(const CheckpointDir& dir, int rank) {
    const auto start = std::chrono::steady_clock::now();
    try {
      dir.save_rank(step, rank, tensors, manifest);
      if (rank == 0) write_checkpoint_index(dir.step_dir(step), world_size, index);
    } catch (const std::exception& e) {
      error = e.what();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    done = true;
  }
};

CheckpointManager::CheckpointManager(CheckpointDir dir, int rank, int world_size,
                                     AllRanksAgree agree, std::vector<Part> parts, int64_t keep,
                                     Arena* staging, int replica)
    : dir_(std::move(dir)),
      rank_(rank),
      world_size_(world_size),
      writes_(replica == 0),
      leader_(replica == 0 && rank == 0),
      agree_(std::move(agree)),
      parts_(std::move(parts)),
      keep_(keep),
      staging_(staging) {
  // The staging buffers up front: pinning ~13 GB of host memory takes seconds, which the first
  // save would otherwise stall for. (A replica that writes nothing stages nothing.)
  if (staging_ && writes_)
    for (Part& p : parts_)
      for (const StateTensor& t : p.state->state_tensors())
        if (!t.rows.replicated || rank_ == 0)
          staging_buffers_[t.name] = Tensor::empty(t.tensor.shape(), DType::f32, *staging_);
  // A save that was killed mid-file left its temporary file: never part of a committed step.
  if (!leader_) return;
  const std::vector<std::string> leftovers = dir_.temporary_files();
  if (leftovers.empty()) return;
  std::string names;
  for (const std::string& path : leftovers) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    names += " " + path;
  }
  log_warn("checkpoint: removed ", leftovers.size(),
           " temporary file(s) of an abandoned save (a writer stopped before it finished):", names);
}

CheckpointManager::~CheckpointManager() {
  if (!in_flight_) return;
  // No collective here (this may run while an error unwinds): the step stays uncommitted, and
  // the previous committed one is what a resume finds.
  if (in_flight_->thread.joinable()) in_flight_->thread.join();
  if (!in_flight_->error.empty())
    log_warn("checkpoint of step ", in_flight_->step, " failed: ", in_flight_->error);
}

bool CheckpointManager::in_flight() const { return in_flight_ != nullptr; }

void CheckpointManager::stage(int64_t step, Write& write) {
  write.step = step;
  write.world_size = world_size_;
  write.manifest = {
      {"format", "frugal-checkpoint-2"},
      {"step", step},
      {"world_size", world_size_},
      {"rank", rank_},
      {"layout", "rows of each tensor split over the ranks in blocks of ceil(rows / world_size)"}};
  std::vector<ops::SideCopy> copies;
  for (Part& p : parts_) {
    const nlohmann::json values = p.state->state_values();
    if (!values.is_null()) write.manifest[p.name] = values;
    for (const StateTensor& t : p.state->state_tensors()) {
      // A replicated tensor is the same on every rank: rank 0's file holds it.
      if (t.rows.replicated && rank_ != 0) continue;
      Tensor host;
      if (!staging_) {
        host = ops::to_host_f32(t.tensor);  // on the CPU backend: the tensor itself
      } else {
        // Into this tensor's buffer of the last save: the copy is all the training waits for.
        Tensor& buffer = staging_buffers_[t.name];
        if (!buffer.defined() || buffer.shape() != t.tensor.shape())
          buffer = Tensor::empty(t.tensor.shape(), DType::f32, *staging_);
        host = buffer;
        if (t.tensor.dtype() == DType::f32)
          copies.emplace_back(host, t.tensor);  // beside the compute stream on a GPU
        else
          ops::copy(host, ops::to_host_f32(t.tensor));  // a bf16 run: widened as it comes down
      }
      write.bytes += host.bytes();
      write.tensors.push_back({t.name, host});
      if (rank_ == 0) write.index.push_back({t.name, t.rows.full_shape, t.rows.replicated});
    }
  }
  for (ops::SideCopy& copy : copies) copy.done();
}

void CheckpointManager::save(int64_t step) {
  if (in_flight_) {
    log_info("checkpoint: step ", in_flight_->step, " is still being written; step ", step,
             " waits for it");
    finish();
  }
  // Every part first settles (a host optimizer may still be updating the weights and moments
  // it shares with other parts), then any part's tensors are read.
  for (Part& p : parts_) p.state->before_save();
  auto write = std::make_unique<Write>();
  if (!writes_) {
    // The first replica's ranks write these rows; this one takes part in the same agreements,
    // at the same points as they do (at once, or from poll() when saves are asynchronous).
    write->step = step;
    write->done = true;
    if (staging_)
      in_flight_ = std::move(write);
    else
      commit(*write);
    return;
  }
  const auto stage_start = std::chrono::steady_clock::now();
  stage(step, *write);
  write->stage_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stage_start).count();
  if (!staging_) {
    write->write(dir_, rank_);
    commit(*write);
    return;
  }
  Write* w = write.get();
  w->thread = std::thread([this, w] { w->write(dir_, rank_); });
  in_flight_ = std::move(write);
}

void CheckpointManager::poll() {
  if (!in_flight_) return;
  if (!agree_(in_flight_->done.load())) return;  // some rank is still writing
  finish();
}

void CheckpointManager::finish() {
  if (!in_flight_) return;
  const std::unique_ptr<Write> write = std::move(in_flight_);
  if (write->thread.joinable()) write->thread.join();
  commit(*write);
}

void CheckpointManager::commit(Write& write) {
  // Commit only when every rank has its file on disk; otherwise the previous step stays.
  const bool all_written = agree_(write.error.empty());
  if (!write.error.empty()) fail("checkpoint of step ", write.step, " failed: ", write.error);
  if (!all_written)
    fail("checkpoint of step ", write.step, " failed on another rank (see its message)");
  if (leader_) dir_.commit(write.step, world_size_, keep_);
  agree_(true);  // no rank goes on (and may save again) before the commit
  committed_ = Committed{write.step, write.bytes, write.stage_seconds, write.seconds};
}

std::optional<CheckpointManager::Committed> CheckpointManager::take_committed() {
  std::optional<Committed> out = committed_;
  committed_.reset();
  return out;
}

size_t CheckpointManager::state_bytes(const std::vector<Part>& parts, int rank) {
  size_t bytes = 0;
  for (const Part& p : parts)
    for (const StateTensor& t : p.state->state_tensors())
      if (!t.rows.replicated || rank == 0) bytes += size_t(t.tensor.numel()) * sizeof(float);
  return bytes;
}

void CheckpointManager::load_values(const std::vector<Part>& parts, const nlohmann::json& manifest,
                                    const std::string& where) {
  for (const Part& p : parts)
    if (manifest.contains(p.name)) {
      try {
        p.state->load_state_values(manifest.at(p.name));
      } catch (const Error& e) {
        fail(where, ": ", e.what());
      }
    } else if (!p.state->state_values().is_null()) {
      fail(where, " has no '", p.name, "' in its manifest");
    }
}

void CheckpointManager::load(int64_t step) { load(step, dir_.manifest(step)); }

void CheckpointManager::load(int64_t step, const nlohmann::json& manifest) {
  load_values(parts_, manifest,
              "checkpoint step " + std::to_string(step) + " in '" + dir_.step_dir(step) + "'");
  // This rank's rows of every tensor, whatever the number of ranks that saved them; a
  // replicated tensor whole from rank 0's file (the same reader when one rank saved them).
  const int saved_world_size = manifest.at("world_size").get<int>();
  ShardedTensorReader sharded(dir_, step, saved_world_size, manifest);
  std::optional<ShardedTensorReader> first_file;
  if (saved_world_size != 1) first_file.emplace(dir_, step, 1, manifest);
  for (Part& p : parts_)
    for (StateTensor& t : p.state->state_tensors()) {
      const RowShard& r = t.rows;
      if (r.last_row == r.first_row) continue;  // only padding on this rank
      ShardedTensorReader& reader = r.replicated && first_file ? *first_file : sharded;
      Tensor rows = t.tensor.rows(0, r.last_row - r.first_row);
      // Checkpoints hold fp32 (a bf16 run's values widen exactly and narrow back unchanged).
      ops::assign(
          rows, reader.read_rows(t.name, r.full_shape, r.first_row, r.last_row).view(rows.shape()));
    }
  for (Part& p : parts_) p.state->after_load();
}

int64_t CheckpointManager::resume(int64_t before_step, RankFileChecker* checker) {
  // A checkpoint directory that is there but cannot be listed (a symlink loop, a file) is not
  // one without checkpoints: starting from scratch would train over what it may hold.
  std::error_code ec;
  const fs::file_status root = fs::symlink_status(dir_.root(), ec);
  if (root.type() != fs::file_type::not_found && !fs::is_directory(dir_.root(), ec)) {
    const std::string kind = non_regular_kind(dir_.root());
    fail("train.resume: the checkpoint directory '", dir_.root(), "' is ",
         kind.empty() ? "a regular file" : kind, ", not a directory");
  }
  if (leader_) dir_.remove_pruned_leftovers();
  std::vector<int64_t> steps;
  for (int64_t step : dir_.committed_steps())
    if (step < before_step) steps.push_back(step);
  // Steps committed once and damaged since (a rank file deleted, or replaced by a FIFO or a
  // symlink loop) are not among them: each is named, as a step refused below is.
  if (leader_) {
    for (const auto& [step, problem] : dir_.incomplete_steps())
      if (step < before_step) log_warn("checkpoint step ", step, " is unusable: ", problem);
    // A step's name on something that is no directory would stop the save of that step.
    for (const std::string& moved : dir_.move_non_directories_aside())
      log_warn("checkpoint: moved aside an entry with a step's name that is no directory: ", moved);
  }
  if (steps.empty()) {
    log_info("train.resume: no committed checkpoint under ", dir_.root(),
             ", starting from scratch");
    return 0;
  }
  const std::string pointer = dir_.latest_problem();
  if (!pointer.empty() && leader_)
    log_warn("train.resume: ", pointer, "; resuming from the newest committed step directory");
  std::optional<RankFileChecker> own_checker;
  if (checker == nullptr) checker = &own_checker.emplace();
  std::string errors;
  for (int64_t step : steps) {
    // Every rank file read through in a child process first (each rank a share), agreed by
    // all, then loaded: a damaged file costs a child, not the run.
    const StepCheck check = check_step(*checker, dir_, step, rank_, world_size_);
    std::string error = check.error;
    if (agree_(error.empty())) {
      try {
        load(step, check.manifest);
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
  if (leader_) {
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
