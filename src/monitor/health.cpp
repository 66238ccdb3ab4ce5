// The health figures of a step: sums by unit and rank, the loss-spike score, the ranks' report,
// and the JSON of metrics.jsonl's "health" member.
#include "monitor/health.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace frugal {

GradientHealth gradient_health(const std::vector<ops::GradHealth>& tensors,
                               const std::vector<size_t>& unit_of,
                               const std::vector<std::string>& unit_names,
                               const std::function<void(std::vector<double>&)>& sum_over_ranks) {
  FRUGAL_CHECK(tensors.size() == unit_of.size(), "gradient_health: ", tensors.size(), " tensors, ",
               unit_of.size(), " unit indices");
  // Per unit: finite sum of squares, non-finite, bf16 underflow, bf16 overflow, values.
  constexpr size_t kFields = 5;
  std::vector<double> sums(unit_names.size() * kFields, 0.0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ops::GradHealth& t = tensors[i];
    FRUGAL_CHECK(unit_of[i] < unit_names.size(), "tensor ", i, " of unit ", unit_of[i], " of ",
                 unit_names.size());
    double* u = &sums[unit_of[i] * kFields];
    // A tensor with a NaN or an inf has a NaN or inf sum: its finite part is unknown, and the
    // unit's norm then counts only its other tensors.
    if (std::isfinite(t.sum_squares)) u[0] += t.sum_squares;
    u[1] += double(t.nonfinite);
    u[2] += double(t.bf16_underflow);
    u[3] += double(t.bf16_overflow);
    u[4] += double(t.count);
  }
  sum_over_ranks(sums);
  GradientHealth h;
  double total_squares = 0, underflow = 0, overflow = 0, values = 0;
  for (size_t u = 0; u < unit_names.size(); ++u) {
    const double* s = &sums[u * kFields];
    UnitGradHealth unit;
    unit.unit = unit_names[u];
    unit.norm = std::sqrt(s[0]);
    unit.nonfinite = static_cast<int64_t>(s[1]);
    if (unit.nonfinite > 0 && h.first_nonfinite_unit.empty()) h.first_nonfinite_unit = unit.unit;
    h.nonfinite += unit.nonfinite;
    total_squares += s[0];
    underflow += s[2];
    overflow += s[3];
    values += s[4];
    h.units.push_back(unit);
  }
  h.norm = std::sqrt(total_squares);
  h.bf16.values = static_cast<int64_t>(values);
  if (values > 0) {
    h.bf16.underflow = underflow / values;
    h.bf16.overflow = overflow / values;
  }
  return h;
}

LossSpikeDetector::LossSpikeDetector(int64_t window, double threshold)
    : window_(std::max<int64_t>(2, window)),
      threshold_(threshold),
      min_history_(std::min<int64_t>(window_, 10)) {}

double LossSpikeDetector::z_score(double loss) const {
  if (int64_t(losses_.size()) < min_history_) return std::numeric_limits<double>::quiet_NaN();
  double mean = 0;
  for (const auto& [step, l] : losses_) mean += l;
  mean /= double(losses_.size());
  double var = 0;
  for (const auto& [step, l] : losses_) var += (l - mean) * (l - mean);
  // A flat window (a loss that has stopped moving) would make any wiggle a spike: the spread is
  // at least 1 % of the mean loss.
  const double spread =
      std::max(std::sqrt(var / double(losses_.size() - 1)), 0.01 * std::abs(mean));
  return (loss - mean) / std::max(spread, 1e-12);
}

bool LossSpikeDetector::is_spike(double loss) const {
  if (!std::isfinite(loss)) return true;
  const double z = z_score(loss);
  return std::isfinite(z) && z > threshold_;
}

void LossSpikeDetector::add(int64_t step, double loss) {
  losses_.emplace_back(step, loss);
  while (int64_t(losses_.size()) > window_) losses_.pop_front();
}

void LossSpikeDetector::forget_after(int64_t step) {
  while (!losses_.empty() && losses_.back().first > step) losses_.pop_back();
}

RankReport rank_report(std::vector<RankTiming> ranks, double factor) {
  RankReport r;
  r.ranks = std::move(ranks);
  if (r.ranks.empty()) return r;
  for (size_t i = 1; i < r.ranks.size(); ++i)
    if (r.ranks[i].busy_seconds > r.ranks[size_t(r.slowest)].busy_seconds) r.slowest = int(i);
  std::vector<double> others;
  for (size_t i = 0; i < r.ranks.size(); ++i)
    if (int(i) != r.slowest) others.push_back(r.ranks[i].busy_seconds);
  if (others.empty()) return r;
  std::sort(others.begin(), others.end());
  const size_t mid = others.size() / 2;
  r.others_median_busy = others.size() % 2 ? others[mid] : 0.5 * (others[mid - 1] + others[mid]);
  const double slowest = r.ranks[size_t(r.slowest)].busy_seconds;
  // Small steps are noisy (a rank's share of the scheduler, who arrives first at a collective):
  // the excess must also be 20 ms and a tenth of the step.
  const double excess = slowest - r.others_median_busy;
  r.slow = slowest > factor * r.others_median_busy &&
           excess > std::max(0.02, 0.1 * r.ranks[size_t(r.slowest)].step_seconds);
  return r;
}

namespace {

nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

nlohmann::json rates_json(const CastRates& c) {
  return {{"underflow", c.underflow}, {"overflow", c.overflow}, {"values", c.values}};
}

}  // namespace

nlohmann::json HealthRecord::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  j["loss_z"] = number_or_null(loss_z);
  if (gradients) {
    const GradientHealth& g = *gradients;
    nlohmann::json units = nlohmann::json::object();
    for (const UnitGradHealth& u : g.units) {
      nlohmann::json entry = {{"norm", number_or_null(u.norm)}};
      if (u.nonfinite) entry["nonfinite"] = u.nonfinite;
      units[u.unit] = entry;
    }
    j["grad"] = {{"norm", number_or_null(g.norm)}, {"nonfinite", g.nonfinite}, {"units", units}};
    if (!g.first_nonfinite_unit.empty()) j["grad"]["first_nonfinite_unit"] = g.first_nonfinite_unit;
  }
  if (!casts.empty()) {
    nlohmann::json c = nlohmann::json::object();
    for (const auto& [name, rates] : casts) c[name] = rates_json(rates);
    j["casts"] = c;
  }
  if (ranks) {
    nlohmann::json step = nlohmann::json::array(), busy = nlohmann::json::array();
    nlohmann::json gpus = nlohmann::json::array();
    bool any_gpu = false;
    for (const RankTiming& t : ranks->ranks) {
      step.push_back(t.step_seconds);
      busy.push_back(t.busy_seconds);
      if (!t.gpu) {
        gpus.push_back(nullptr);
        continue;
      }
      any_gpu = true;
      gpus.push_back({{"sm_clock_mhz", t.gpu->sm_clock_mhz},
                      {"max_sm_clock_mhz", t.gpu->max_sm_clock_mhz},
                      {"temperature_c", t.gpu->temperature_c},
                      {"power_w", t.gpu->power_w},
                      {"power_limit_w", t.gpu->power_limit_w},
                      {"throttle", throttle_reason_names(t.gpu->throttle_reasons)}});
    }
    j["ranks"] = {{"step_seconds", step},
                  {"busy_seconds", busy},
                  {"slowest", ranks->slowest},
                  {"slow", ranks->slow}};
    if (any_gpu) j["gpus"] = gpus;
  }
  if (link) {
    const double bytes = double(link->bytes_to_device + link->bytes_to_host);
    const double gb_per_s = link_seconds > 0 ? bytes / link_seconds / 1e9 : 0;
    j["link"] = {{"bytes_to_device", link->bytes_to_device},
                 {"bytes_to_host", link->bytes_to_host},
                 {"seconds", link_seconds},
                 {"gb_per_s", gb_per_s},
                 {"peak_gb_per_s", link_peak_gb_per_s},
                 {"utilisation", link_peak_gb_per_s > 0 ? gb_per_s / link_peak_gb_per_s : 0}};
  }
  return j;
}

}  // namespace frugal
