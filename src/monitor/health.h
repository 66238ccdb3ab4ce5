// What metrics.jsonl's "health" member of a step holds, and the pieces that compute it without
// knowing ranks or devices: per-unit gradient figures from the gradient pass (ops::grad_health),
// cast rates, the loss-spike score, the ranks' times, link traffic, GPU sensors.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "monitor/gpu_sensors.h"
#include "ops/ops.h"

namespace frugal {

// The values of one kind of cast (bf16 gradients; FP8's casts add theirs) that became zero or
// subnormal (underflow) or inf / saturated (overflow), as fractions of the values cast.
struct CastRates {
  double underflow = 0;
  double overflow = 0;
  int64_t values = 0;  // how many values the fractions are of
};

struct UnitGradHealth {
  std::string unit;  // "embed", "layers.3", "head"
  double norm = 0;   // of its finite values, all ranks
  int64_t nonfinite = 0;
};

// A step's gradients, all ranks: the global norm, each unit's, and where non-finite values are.
struct GradientHealth {
  double norm = 0;  // of the finite values (the step's grad_norm is NaN when some are not)
  int64_t nonfinite = 0;
  std::string first_nonfinite_unit;  // in the model's unit order; empty when all are finite
  std::vector<UnitGradHealth> units;
  CastRates bf16;  // the gradients cast to bf16
};

// Sums the gradient pass's per-tensor results into units and over the ranks: tensor i belongs
// to unit unit_of[i] (an index into unit_names); sum_over_ranks replaces a vector of doubles by
// its element-wise sum over the ranks (the identity on one rank). Every rank gets the same.
GradientHealth gradient_health(const std::vector<ops::GradHealth>& tensors,
                               const std::vector<size_t>& unit_of,
                               const std::vector<std::string>& unit_names,
                               const std::function<void(std::vector<double>&)>& sum_over_ranks);

// The loss of a step against the recent ones: z = (loss - mean) / std over the last `window`
// accepted losses, once `min_history` are there (NaN before). A spike is z above the threshold
// or a loss that is not finite. Spikes are not added to the window; rollback forgets the
// losses past the step it returns to.
class LossSpikeDetector {
 public:
  LossSpikeDetector(int64_t window, double threshold);
  double z_score(double loss) const;
  bool is_spike(double loss) const;
  void add(int64_t step, double loss);
  void forget_after(int64_t step);

 private:
  int64_t window_;
  double threshold_;
  int64_t min_history_;
  std::deque<std::pair<int64_t, double>> losses_;
};

// Bytes moved between host and device memory (offload) since the last report.
struct OffloadTraffic {
  int64_t bytes_to_device = 0;
  int64_t bytes_to_host = 0;
};

// One rank's figures of the log step's window: its seconds per step, the part it spent working
// (not waiting for the others in collectives), and its GPU's sensors.
struct RankTiming {
  double step_seconds = 0;
  double busy_seconds = 0;
  std::optional<GpuSensors> gpu;
};

// Every rank's timing: the slowest rank by busy time, and whether it is slow: more than
// `factor` times the median of the others, and by more than 20 ms and a tenth of its step
// (small steps are noisy); a rank that waits for one slow peer is never busier than it.
struct RankReport {
  std::vector<RankTiming> ranks;
  int slowest = 0;
  bool slow = false;
  double others_median_busy = 0;
};
RankReport rank_report(std::vector<RankTiming> ranks, double factor);

// The health member of a log step's record (and of a step where something went wrong).
struct HealthRecord {
  std::optional<GradientHealth> gradients;
  // Cast rates by name. "bf16_grad" comes from the gradient pass; FP8's casts add their own
  // entries ("fp8_e4m3_weights", ...) through HealthMonitor::add_cast_rates before the step's
  // record is written.
  std::map<std::string, CastRates> casts;
  double loss_z = 0;  // NaN (null) until the window has enough losses
  std::optional<RankReport> ranks;
  std::optional<OffloadTraffic> link;
  double link_seconds = 0;        // the window's wall seconds the traffic is over
  double link_peak_gb_per_s = 0;  // measured host -> device copy peak (0: not measured)
  nlohmann::json to_json() const;
};

}  // namespace frugal
