// The health monitor of a training run: what it measures on log steps, the verdicts of the
// guards, the validations of every N steps, and the run's summary table.
#include "train/health_monitor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

#include "core/log.h"
#include "monitor/metrics.h"
#include "ops/ops.h"
#include "train/training_run.h"

namespace frugal {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The sum of a host vector of doubles over every rank (MPI; the identity on one rank).
void sum_over_ranks(Comm& comm, std::vector<double>& values) {
  if (comm.size() == 1 || values.empty()) return;
  Tensor t = Tensor::empty({int64_t(values.size())}, DType::f64);
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(double));
  comm.all_reduce_sum(t)->wait();
  std::memcpy(values.data(), t.raw(), values.size() * sizeof(double));
}

// Every rank's `values` (the same count on each), rank after rank.
std::vector<double> gather_from_ranks(Comm& comm, const std::vector<double>& values) {
  if (comm.size() == 1) return values;
  const int64_t n = int64_t(values.size());
  Tensor send = Tensor::empty({n}, DType::f64);
  std::memcpy(send.raw(), values.data(), values.size() * sizeof(double));
  Tensor recv = Tensor::empty({n * comm.size()}, DType::f64);
  comm.all_gather(send, recv)->wait();
  const double* r = recv.data<double>();
  return std::vector<double>(r, r + recv.numel());
}

std::string fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

HealthMonitor::HealthMonitor(TrainingRun& run, const FaultInjection& fault)
    : run_(run),
      fault_(fault),
      rank_(run.host_mesh.world->rank()),
      spikes_(run.config.monitor.spike_window, run.config.monitor.spike_z) {
  // Which unit each trainable shard (the optimizer's order) belongs to.
  std::map<std::string, size_t> unit_by_param;
  const std::vector<UnitSpec>& units = run.params->units();
  for (size_t u = 0; u < units.size(); ++u) {
    unit_names_.push_back(units[u].name);
    for (const ParamSpec& p : units[u].params) unit_by_param[p.name] = u;
  }
  for (const TrainableShard& s : run.params->trainable()) {
    const auto it = unit_by_param.find(s.name);
    FRUGAL_CHECK(it != unit_by_param.end(), "trainable '", s.name, "' is in no unit");
    unit_of_.push_back(it->second);
  }
  offload_link_ = run.use_gpu && run.config.parallel.offload != Offload::none;
#ifdef FRUGAL_HAVE_CUDA
  if (run.use_gpu && run.config.monitor.health) {
    std::string why;
    nvml_ = Nvml::load(&why);
    if (nvml_)
      pci_bus_id_ = gpu_pci_bus_id(run.memory->gpu->device());
    else if (rank_ == 0)
      log_info("health: no GPU sensors (", why, ")");
    if (offload_link_) {
      link_peak_gb_per_s_ = measure_host_to_device_gb_per_s(*run.memory->gpu, size_t(256) << 20);
      if (rank_ == 0)
        log_info("health: host -> device copy peak ", fixed(link_peak_gb_per_s_, 1), " GB/s");
    }
  }
#endif
  window_start_time_ = now_seconds();
  window_start_waited_ = run.host_mesh.world->failure()->waited_seconds();
}

HealthMonitor::~HealthMonitor() = default;

bool HealthMonitor::log_step(int64_t step) const {
  return run_.config.monitor.health && step % run_.config.monitor.log_every == 0;
}

void HealthMonitor::add_cast_rates(const std::string& name, const CastRates& rates) {
  record_.casts[name] = rates;
}

StepHooks HealthMonitor::hooks(int64_t step, bool first_pass) {
  using Kind = FaultInjection::Kind;
  step_ = step;
  record_ = HealthRecord();
  record_.loss_z = kNaN;
  measured_ = noteworthy_ = false;
  verdict_ = Verdict::apply;
  reason_.clear();
  const MonitorConfig& m = run_.config.monitor;

  recompute_ = RecomputeCheck();
  checking_recompute_ = m.check_recompute_every > 0 && step % m.check_recompute_every == 0 &&
                        run_.config.train.activation_checkpointing != CheckpointPolicy::none;
  if (first_pass && fault_.at(Kind::recompute, rank_, step)) {
    checking_recompute_ = run_.config.train.activation_checkpointing != CheckpointPolicy::none;
    recompute_.perturb_layer = 0;
    std::fprintf(stderr, "frugal: rank %d: injected fault 'recompute' at step %lld\n", rank_,
                 static_cast<long long>(step));
  }
  run_.model->set_recompute_check(checking_recompute_ ? &recompute_ : nullptr);
  flip_replica_ = first_pass && fault_.at(Kind::bitflip, rank_, step);

  StepHooks hooks;
  if (log_step(step))
    hooks.gradient_pass = [this](const std::vector<Tensor>& grads) { return gradient_pass(grads); };
  if (first_pass && fault_.at(Kind::nan, rank_, step)) {
    // NaNs in layers.0's first trainable tensor: after the backward, or under per-layer updates
    // when layers.0's gradients are final (after the units above it were updated).
    const auto damage = [this, step](const std::vector<size_t>* slices) {
      std::vector<TrainableShard> shards = run_.params->trainable();
      for (size_t k = 0; k < shards.size(); ++k) {
        TrainableShard& s = shards[k];
        if (s.name.find("layers.0.") == std::string::npos || s.grad.numel() == 0) continue;
        if (slices && std::find(slices->begin(), slices->end(), k) == slices->end()) return;
        std::fprintf(stderr, "frugal: rank %d: injected fault 'nan' at step %lld (%s)\n", rank_,
                     static_cast<long long>(step), s.name.c_str());
        ops::scale_inplace(s.grad, std::numeric_limits<float>::quiet_NaN());
        return;
      }
    };
    hooks.after_backward = [damage] { damage(nullptr); };
    hooks.before_unit_update = [damage](const std::vector<size_t>& slices) { damage(&slices); };
  }
  hooks.accept = [this, step](const StepResult& r) { return accept(step, r); };
  return hooks;
}

double HealthMonitor::gradient_pass(const std::vector<Tensor>& grads) {
  const std::vector<ops::GradHealth> tensors = ops::grad_health(grads);
  // In ops::sum_squares' order, so the norm is the same bit for bit as on other steps.
  double local = 0;
  for (const ops::GradHealth& t : tensors) local += t.sum_squares;
  FRUGAL_CHECK(tensors.size() == unit_of_.size(), "the gradient pass got ", tensors.size(),
               " tensors; this rank trains ", unit_of_.size());
  Comm& comm = *run_.host_mesh.world;
  GradientHealth g = gradient_health(tensors, unit_of_, unit_names_,
                                     [&comm](std::vector<double>& v) { sum_over_ranks(comm, v); });
  record_.casts["bf16_grad"] = g.bf16;
  record_.gradients = std::move(g);
  measured_ = true;
  return local;
}

bool HealthMonitor::accept(int64_t step, const StepResult& r) {
  const MonitorConfig& m = run_.config.monitor;
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    // Every rank sees the same loss and norm: all measure, all skip.
    if (!measured_) {
      std::vector<Tensor> grads;
      for (const TrainableShard& s : run_.params->trainable()) grads.push_back(s.grad);
      gradient_pass(grads);
    }
    noteworthy_ = true;
    ++counts_.skipped_nonfinite;
    ++consecutive_nonfinite_;
    const GradientHealth& g = *record_.gradients;
    reason_ =
        "loss " + fixed(r.loss, 4) + ", " + std::to_string(g.nonfinite) +
        " non-finite gradient values" +
        (g.first_nonfinite_unit.empty() ? "" : ", the first in unit " + g.first_nonfinite_unit);
    if (consecutive_nonfinite_ > m.max_skipped_steps) {
      if (m.on_divergence != DivergenceAction::rollback)
        fail("training diverged: ", consecutive_nonfinite_, " steps in a row up to step ", step,
             " had non-finite gradients (", reason_,
             "); try a lower train.lr, a stronger optim.grad_clip, or "
             "monitor.on_divergence = rollback");
      verdict_ = Verdict::rollback;
      rollback_before_ = step - consecutive_nonfinite_;
      consecutive_nonfinite_ = 0;
      return false;
    }
    if (rank_ == 0)
      log_warn("step ", step, ": ", reason_, "; the step is skipped (", consecutive_nonfinite_,
               " in a row, monitor.max_skipped_steps = ", m.max_skipped_steps, ")");
    verdict_ = Verdict::skip_nonfinite;
    return false;
  }
  consecutive_nonfinite_ = 0;
  counts_.max_grad_norm = std::max(counts_.max_grad_norm, r.grad_norm);
  record_.loss_z = spikes_.z_score(r.loss);
  if (!spikes_.is_spike(r.loss)) {
    spikes_.add(step, r.loss);
    return true;
  }
  noteworthy_ = true;
  ++counts_.spikes;
  reason_ = "loss " + fixed(r.loss, 4) + " is a spike (z = " + fixed(record_.loss_z, 1) +
            " over the last " + std::to_string(m.spike_window) + " steps)";
  switch (m.on_divergence) {
    case DivergenceAction::warn:
      if (rank_ == 0) log_warn("step ", step, ": ", reason_, " (monitor.on_divergence = warn)");
      spikes_.add(step, r.loss);
      verdict_ = Verdict::warn_spike;
      return true;
    case DivergenceAction::skip_batch:
      if (rank_ == 0) log_warn("step ", step, ": ", reason_, "; its batch is skipped");
      ++counts_.skipped_spikes;
      verdict_ = Verdict::skip_spike;
      return false;
    case DivergenceAction::rollback:
      verdict_ = Verdict::rollback;
      rollback_before_ = step - 1;
      return false;
  }
  return true;
}

void HealthMonitor::rolled_back_to(int64_t step) {
  spikes_.forget_after(step);
  ++counts_.rollbacks;
}

void HealthMonitor::report_recompute(int64_t step, nlohmann::json& record) {
  // Each rank compared its own blocks; the mismatches are summed, and each rank names its own.
  Comm& comm = *run_.host_mesh.world;
  for (const RecomputeCheck::Mismatch& m : recompute_.mismatches)
    log_warn("step ", step, ": rank ", rank_, ": the recomputed forward of unit layers.", m.layer,
             " differs from the original (checksum ", m.recomputed, " vs ", m.forward,
             "): a non-deterministic kernel or faulty hardware");
  std::vector<double> counts = {double(recompute_.mismatches.size()),
                                double(recompute_.blocks_checked)};
  sum_over_ranks(comm, counts);
  std::vector<double> layers;
  record["recompute_check"] = {{"blocks", int64_t(counts[1])}, {"mismatches", int64_t(counts[0])}};
  if (counts[0] > 0) {
    // Which rank and unit, for the record: every rank's first mismatch (or -1).
    const double first =
        recompute_.mismatches.empty() ? -1 : double(recompute_.mismatches[0].layer);
    const std::vector<double> per_rank = gather_from_ranks(comm, {first});
    nlohmann::json where = nlohmann::json::array();
    for (size_t r = 0; r < per_rank.size(); ++r)
      if (per_rank[r] >= 0)
        where.push_back({{"rank", r}, {"unit", "layers." + std::to_string(int64_t(per_rank[r]))}});
    record["recompute_check"]["where"] = where;
    counts_.recompute_mismatches += int64_t(counts[0]);
  }
}

void HealthMonitor::check_replicas(int64_t step, bool inject_flip, nlohmann::json& record) {
  // Replicated state (GaLore's right projectors and left moments, any part's replicated
  // tensors) must be the same on every rank: a checksum per tensor, gathered and compared.
  run_.params->wait_for_updates();
  std::vector<StateTensor> replicated;
  for (StateTensor& t : run_.optimizer->state_tensors())
    if (t.rows.replicated) replicated.push_back(t);
  for (const auto& part : run_.states)
    for (StateTensor& t : part->state_tensors())
      if (t.rows.replicated) replicated.push_back(t);
  if (inject_flip) {
    if (replicated.empty())
      fail(
          "FRUGAL_INJECT_FAULT=bitflip: this run has no replicated state tensor to flip (GaLore's "
          "right projectors are: optim.type = galore_adamw)");
    Tensor first = replicated[0].tensor.view({replicated[0].tensor.numel()}).rows(0, 1);
    ops::scale_inplace(first, 2.0f);  // one exponent bit
    std::fprintf(stderr, "frugal: rank %d: injected fault 'bitflip' at step %lld (%s)\n", rank_,
                 static_cast<long long>(step), replicated[0].name.c_str());
  }
  if (replicated.empty()) return;
  std::vector<double> sums;
  for (const StateTensor& t : replicated) sums.push_back(ops::sum_squares({t.tensor}));
  Comm& comm = *run_.host_mesh.world;
  const std::vector<double> all = gather_from_ranks(comm, sums);
  nlohmann::json mismatches = nlohmann::json::array();
  for (size_t i = 0; i < replicated.size(); ++i)
    for (int r = 1; r < comm.size(); ++r) {
      const double theirs = all[size_t(r) * sums.size() + i], first = all[i];
      if (theirs == first || (std::isnan(theirs) && std::isnan(first))) continue;
      mismatches.push_back({{"tensor", replicated[i].name}, {"rank", r}});
      if (rank_ == 0)
        log_warn("step ", step, ": replicated tensor '", replicated[i].name, "' differs on rank ",
                 r, " from rank 0 (checksum ", theirs, " vs ", first,
                 "): memory or communication corrupted it");
    }
  record["replica_check"] = {{"tensors", replicated.size()}, {"mismatches", mismatches}};
  counts_.replica_mismatches += int64_t(mismatches.size());
  if (!mismatches.empty()) {
    noteworthy_ = true;
    // The state is no longer one model: rollback restores every rank's copy from a checkpoint.
    if (run_.config.monitor.on_divergence == DivergenceAction::rollback) {
      verdict_ = Verdict::rollback;
      rollback_before_ = step;
      reason_ = "replicated state differs across ranks";
    }
  }
}

RankReport HealthMonitor::gather_ranks(double step_seconds, double busy_seconds) {
  std::vector<double> mine = {step_seconds, busy_seconds, 0, 0, 0, 0, 0, 0, 0};
  GpuSensors sensors;
  if (nvml_ && nvml_->read(pci_bus_id_, sensors)) {
    mine[2] = 1;
    mine[3] = sensors.sm_clock_mhz;
    mine[4] = sensors.max_sm_clock_mhz;
    mine[5] = sensors.temperature_c;
    mine[6] = sensors.power_w;
    mine[7] = sensors.power_limit_w;
    mine[8] = double(sensors.throttle_reasons);  // bits below 2^53: exact
  }
  const std::vector<double> all = gather_from_ranks(*run_.host_mesh.world, mine);
  std::vector<RankTiming> ranks;
  for (size_t r = 0; r * mine.size() < all.size(); ++r) {
    const double* v = &all[r * mine.size()];
    RankTiming t;
    t.step_seconds = v[0];
    t.busy_seconds = v[1];
    if (v[2] != 0) {
      GpuSensors s;
      s.sm_clock_mhz = unsigned(v[3]);
      s.max_sm_clock_mhz = unsigned(v[4]);
      s.temperature_c = unsigned(v[5]);
      s.power_w = v[6];
      s.power_limit_w = v[7];
      s.throttle_reasons = uint64_t(v[8]);
      t.gpu = s;
    }
    ranks.push_back(t);
  }
  return rank_report(std::move(ranks), run_.config.monitor.slow_rank_factor);
}

void HealthMonitor::after_step(int64_t step, double step_seconds, nlohmann::json& record) {
  const MonitorConfig& m = run_.config.monitor;
  ++window_steps_;
  window_seconds_ += step_seconds;
  if (checking_recompute_) report_recompute(step, record);
  run_.model->set_recompute_check(nullptr);
  if (flip_replica_ || (m.check_replicas_every > 0 && step % m.check_replicas_every == 0))
    check_replicas(step, flip_replica_, record);

  if (log_step(step)) {
    // Per step over the window since the last log step: wall time, and the part of it this
    // rank did not spend waiting for the others.
    Comm& world = *run_.host_mesh.world;
    const double waited = world.failure()->waited_seconds() - window_start_waited_;
    const double per_step = window_seconds_ / double(window_steps_);
    const double busy = std::max(0.0, window_seconds_ - waited) / double(window_steps_);
    RankReport ranks = gather_ranks(per_step, busy);
    if (ranks.slow) {
      ++counts_.slow_rank_reports;
      if (rank_ == 0)
        log_warn("step ", step, ": rank ", ranks.slowest, " is slow: busy ",
                 fixed(ranks.ranks[size_t(ranks.slowest)].busy_seconds, 3),
                 " s per step against a median of ", fixed(ranks.others_median_busy, 3),
                 " s on the other ranks (the others wait for it)");
    }
    for (size_t r = 0; r < ranks.ranks.size(); ++r) {
      const std::optional<GpuSensors>& g = ranks.ranks[r].gpu;
      if (!g || !is_throttling(g->throttle_reasons)) continue;
      ++counts_.throttle_reports;
      if (rank_ != 0) continue;
      std::string reasons;
      for (const std::string& n : throttle_reason_names(g->throttle_reasons))
        reasons += (reasons.empty() ? "" : ", ") + n;
      log_warn("step ", step, ": rank ", r, "'s GPU is throttled (", reasons, "): SM clock ",
               g->sm_clock_mhz, " of ", g->max_sm_clock_mhz, " MHz, ", g->temperature_c, " C, ",
               fixed(g->power_w, 0), " of ", fixed(g->power_limit_w, 0), " W");
    }
    record_.ranks = std::move(ranks);
    if (offload_link_) {
      const Zero3Placement::LinkBytes bytes = run_.params->take_link_bytes();
      record_.link = OffloadTraffic{bytes.to_device, bytes.to_host};
      record_.link_seconds = now_seconds() - window_start_time_;
      record_.link_peak_gb_per_s = link_peak_gb_per_s_;
    }
    window_steps_ = 0;
    window_seconds_ = 0;
    window_start_waited_ = world.failure()->waited_seconds();
    window_start_time_ = now_seconds();
  }
  if (log_step(step) || noteworthy_ || !record_.casts.empty()) {
    record["health"] = record_.to_json();
    if (verdict_ != Verdict::apply) {
      const char* names[] = {"apply", "skipped_nonfinite", "skipped_spike", "warned_spike",
                             "rollback"};
      record["health"]["verdict"] = names[int(verdict_)];
    }
  }
}

std::string run_summary_table(const nlohmann::json& t, const HealthCounts& c) {
  std::vector<std::pair<std::string, std::string>> rows = {
      {"steps", t.value("steps", std::string())},
      {"time", t.value("time", std::string())},
      {"tokens/s", t.value("tokens_per_s", std::string())},
      {"val loss", t.value("val_loss", std::string())},
      {"peak memory per rank", t.value("peak_memory", std::string())},
      {"max grad norm", fixed(c.max_grad_norm, 3)},
      {"steps skipped (non-finite gradients)", std::to_string(c.skipped_nonfinite)},
      {"loss spikes (skipped)",
       std::to_string(c.spikes) + " (" + std::to_string(c.skipped_spikes) + ")"},
      {"rollbacks", std::to_string(c.rollbacks)},
      {"recompute mismatches", std::to_string(c.recompute_mismatches)},
      {"replica mismatches", std::to_string(c.replica_mismatches)},
      {"slow-rank / throttling reports",
       std::to_string(c.slow_rank_reports) + " / " + std::to_string(c.throttle_reports)}};
  size_t width = 0;
  for (const auto& [k, v] : rows) width = std::max(width, k.size());
  std::ostringstream out;
  out << "summary:";
  for (const auto& [k, v] : rows) out << "\n  " << k << std::string(width - k.size() + 2, ' ') << v;
  return out.str();
}

}  // namespace frugal
