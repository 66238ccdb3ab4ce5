// The health of a training run, step by step (doc/health.md): the gradient pass of log steps
// (non-finite values by unit, norms, bf16 underflow and overflow, fused with the norm's pass),
// the loss-spike score, the ranks' times, offload traffic and GPU sensors; the guards (a step
// with non-finite gradients is skipped, a spike warns, skips its batch or asks for a rollback;
// a slow or throttling rank is named); and the validations of every N steps (a block's
// recompute against its forward, replicated tensors across ranks). The loop (trainer.cpp)
// carries out the verdicts; this class decides them, the same on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "model/llama_model.h"
#include "monitor/gpu_sensors.h"
#include "monitor/health.h"
#include "train/fault_injection.h"
#include "train/train_step.h"

namespace frugal {

struct TrainingRun;

// What the run's guards did, for the summary at the end.
struct HealthCounts {
  int64_t skipped_nonfinite = 0;
  int64_t spikes = 0;
  int64_t skipped_spikes = 0;
  int64_t rollbacks = 0;
  int64_t recompute_mismatches = 0;
  int64_t replica_mismatches = 0;
  int64_t slow_rank_reports = 0;
  int64_t throttle_reports = 0;
  double max_grad_norm = 0;
};

class HealthMonitor {
 public:
  enum class Verdict { apply, skip_nonfinite, skip_spike, warn_spike, rollback };

  HealthMonitor(TrainingRun& run, const FaultInjection& fault);
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  // The hooks of step `step`. `first_pass`: the step runs for the first time (not replayed
  // after a rollback); injected faults fire only then.
  StepHooks hooks(int64_t step, bool first_pass);
  // What accept decided for the step just run.
  Verdict verdict() const { return verdict_; }
  std::string verdict_reason() const { return reason_; }
  // A rollback's checkpoint must be older than this step: a loss spike at step s shows weights
  // the update of step s - 1 made, which its checkpoint holds; replicated state is saved from
  // rank 0, so any checkpoint before the step restores it.
  int64_t rollback_before() const { return rollback_before_; }

  // After the step (its record written by the caller): the validations due, the ranks'
  // timing, and on a log step (or one where something went wrong) record["health"].
  void after_step(int64_t step, double step_seconds, nlohmann::json& record);
  // Other casts' rates for this step's health record (FP8's, by name), before after_step.
  void add_cast_rates(const std::string& name, const CastRates& rates);
  // A rollback to `step`: the losses after it leave the spike window.
  void rolled_back_to(int64_t step);

  const HealthCounts& counts() const { return counts_; }

 private:
  bool log_step(int64_t step) const;
  double gradient_pass(const std::vector<Tensor>& grads);
  bool accept(int64_t step, const StepResult& result);
  void check_replicas(int64_t step, bool inject_flip, nlohmann::json& record);
  void report_recompute(int64_t step, nlohmann::json& record);
  RankReport gather_ranks(double window_step_seconds, double window_busy_seconds);

  TrainingRun& run_;
  FaultInjection fault_;
  int rank_;
  std::vector<std::string> unit_names_;
  std::vector<size_t> unit_of_;  // of each trainable shard
  LossSpikeDetector spikes_;
  std::unique_ptr<Nvml> nvml_;
  std::string pci_bus_id_;
  double link_peak_gb_per_s_ = 0;
  bool offload_link_ = false;

  // The step in progress.
  int64_t step_ = 0;
  HealthRecord record_;
  bool measured_ = false;    // record_.gradients holds this step's gradients
  bool noteworthy_ = false;  // the record goes into metrics.jsonl even off a log step
  Verdict verdict_ = Verdict::apply;
  std::string reason_;
  int64_t rollback_before_ = 0;
  int64_t consecutive_nonfinite_ = 0;
  RecomputeCheck recompute_;
  bool checking_recompute_ = false;
  bool flip_replica_ = false;

  // Since the last log step.
  int64_t window_steps_ = 0;
  double window_seconds_ = 0, window_start_waited_ = 0, window_start_time_ = 0;

  HealthCounts counts_;
};

// The table at the end of a run: steps, losses, speed, memory, and what the guards did.
std::string run_summary_table(const nlohmann::json& totals, const HealthCounts& counts);

}  // namespace frugal
