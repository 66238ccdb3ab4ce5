// GaLore AdamW on row shards: refreshes and left-side projections in begin_step (collectives),
// the moments and the projected-back step in update(k) (local). The refreshes themselves (a new
// projector from the gradient, inline or pipelined on the host, and the moments it rotates)
// are in galore_refresh.cpp.
//
// Per projected matrix and step, as galore-torch's GaLoreAdamW (t counts from 0, the
// reference's state["step"] before its increment):
//   if t is a refresh step: new projector from G (galore_projector.h)
//   R = G Q^T (right) or P^T G (left), with the clipping factor
//   m = b1 m + (1 - b1) R;  v = b2 v + (1 - b2) R^2;  N = m / (sqrt(v) + eps)
//   W -= lr sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)) * scale * (N Q or P N)
//   W -= lr wd W   (after the step: the reference's order)
#include "optim/galore_adamw.h"

#include <cmath>
#include <string>

#include "core/progress.h"
#include "model/lora.h"
#include "ops/ops.h"
#include "optim/quantized_moments.h"

namespace frugal {

int64_t galore_refresh_phase(int64_t j, int64_t count, const GaloreConfig& config) {
  return config.stagger && count > 0 ? j * config.update_proj_gap / count : 0;
}

bool galore_projects(const std::string& name, const Shape& shape) {
  return shape.size() == 2 && is_block_projection(name);
}

GaloreAdamW::GaloreAdamW(std::vector<TrainableShard> shards, const AdamWConfig& adamw,
                         const GaloreConfig& galore, Arena& state_arena)
    : shards_(std::move(shards)), adamw_(adamw), galore_(galore) {
  FRUGAL_CHECK(galore_.update_proj_gap >= 1, "GaLore update_proj_gap ", galore_.update_proj_gap);
  for (size_t k = 0; k < shards_.size(); ++k) {
    const TrainableShard& s = shards_[k];
    const Shape& full = s.rows.full_shape;
    if (!galore_projects(s.name, full)) {
      matrix_of_.push_back(-1);
      const DType dtype = adamw_.moments.value_or(s.param.dtype());
      const bool int8 = adamw_.int8_state && int8_moments_apply(full, adamw_.int8_min_elements);
      m_.push_back(int8 ? Tensor() : ops::zeros(s.param.shape(), dtype, state_arena));
      v_.push_back(int8 ? Tensor() : ops::zeros(s.param.shape(), dtype, state_arena));
      qm_.push_back(int8 ? int8_moment_zeros(s.param.shape(), state_arena)
                         : ops::QuantizedMoment());
      qv_.push_back(int8 ? int8_moment_zeros(s.param.shape(), state_arena)
                         : ops::QuantizedMoment());
      continue;
    }
    Matrix x;
    x.rank = galore_rank_of(full, galore_.projector.rank);
    const int64_t r = x.rank;
    x.shard = k;
    x.side = galore_side(full);
    x.rows = full[0];
    x.cols = full[1];
    x.local_rows = s.rows.last_row - s.rows.first_row;
    const int64_t buffer_rows = s.param.size(0);
    // The projected moments and projectors are fp32 whatever optim.state_dtype says: they are
    // small, and a subspace in bf16 would not stay orthonormal.
    // With optim.state_dtype = int8 the moments are 8-bit as AdamW's (GaLoreAdamW8bit runs
    // bitsandbytes' 8-bit Adam on the projected gradient): right, in blocks within each of this
    // rank's rows (the weight's row shard); left, replicated [r, n].
    const bool right = x.side == GaloreSide::right;
    const Shape moment_shape = right ? Shape{buffer_rows, r} : Shape{r, x.cols};
    if (adamw_.int8_state &&
        int8_moments_apply(right ? Shape{x.rows, r} : moment_shape, adamw_.int8_min_elements)) {
      x.exp_avg_int8 = int8_moment_zeros(moment_shape, state_arena);
      x.exp_avg_sq_int8 = int8_moment_zeros(moment_shape, state_arena);
    } else {
      x.exp_avg = ops::zeros(moment_shape, DType::f32, state_arena);
      x.exp_avg_sq = ops::zeros(moment_shape, DType::f32, state_arena);
    }
    x.projector =
        ops::zeros(right ? Shape{r, x.cols} : Shape{buffer_rows, r}, DType::f32, state_arena);
    matrix_of_.push_back(static_cast<int>(matrices_.size()));
    m_.emplace_back();
    v_.emplace_back();
    qm_.emplace_back();
    qv_.emplace_back();
    matrices_.push_back(std::move(x));
  }
  // On a GPU the host buffers of the refreshes (the downloads of their small products, the
  // factorisations) are page-locked, so that their copies run beside the kernels: a copy into
  // pageable memory would block the host until the GPU had drained its queue.
  if (!matrices_.empty() && matrices_.front().projector.device() != Device::cpu)
    scratch_ = ops::side_copy_host_arena("GaLore scratch (pinned host)");
  // The refresh phases, in the shards' (forward) order.
  const int64_t count = static_cast<int64_t>(matrices_.size());
  for (int64_t j = 0; j < count; ++j)
    matrices_[size_t(j)].phase = galore_refresh_phase(j, count, galore_);
  FRUGAL_CHECK(galore_.refresh == GaloreRefresh::immediate ||
                   galore_.moments_on_refresh != MomentsOnRefresh::reset,
               "GaLore's pipelined refreshes with moments_on_refresh = reset");
  for (Matrix& x : matrices_) x.stages = galore_refresh_stages({x.rows, x.cols}, settings_of(x));
  in_flight_.resize(matrices_.size());
  if (galore_.refresh == GaloreRefresh::pipelined) worker_ = std::make_unique<HostWorker>();
}

GaloreAdamW::~GaloreAdamW() {
  for (auto& f : in_flight_)
    if (f && f->host.valid()) f->host.wait();
}

GaloreAdamW::InlineProgress GaloreAdamW::inline_progress(int64_t t) const {
  if (pipelined(t)) return nullptr;
  int64_t due = 0;
  for (size_t j = 0; j < matrices_.size(); ++j) due += refresh_due(j, t) ? 1 : 0;
  if (due == 0) return nullptr;
  return std::make_unique<Progress>(
      "galore: projectors of step " + std::to_string(t + 1) + " computed", due,
      [](int64_t n) { return std::to_string(n); }, 15);
}

bool GaloreAdamW::refresh_due(size_t j, int64_t t) const {
  return t == 0 || t % galore_.update_proj_gap == matrices_[j].phase;
}

int64_t GaloreAdamW::last_refresh(size_t j, int64_t t) const {
  const int64_t phase = matrices_[j].phase;
  if (t < phase) return 0;
  return t - (t - phase) % galore_.update_proj_gap;
}

Tensor GaloreAdamW::gradient_rows(const Matrix& x) {
  const Tensor rows = shards_[x.shard].grad.rows(0, x.local_rows);
  if (rows.dtype() == DType::f32) return rows;
  // A bf16 run's gradient, widened where it lives.
  Tensor wide = galore_scratch(rows, rows.shape(), *scratch_);
  ops::assign(wide, rows);
  return wide;
}

Tensor GaloreAdamW::gradient_operand(const Matrix& x) {
  const Tensor rows = shards_[x.shard].grad.rows(0, x.local_rows);
  const DType dtype =
      galore_.precision == GaloreProjectionPrecision::bf16 ? DType::bf16 : DType::f32;
  if (rows.dtype() == dtype) return rows;
  Tensor out = galore_scratch(rows, rows.shape(), *scratch_, dtype);
  ops::assign(out, rows);
  return out;
}

Tensor GaloreAdamW::operand(const Tensor& t) {
  if (galore_.precision != GaloreProjectionPrecision::bf16) return t;
  Tensor out = galore_scratch(t, t.shape(), *scratch_, DType::bf16);
  ops::assign(out, t);
  return out;
}

const Tensor& GaloreAdamW::projector_operand(Matrix& x) {
  if (!x.projector_operand.defined())
    x.projector_operand =
        operand(x.side == GaloreSide::right ? x.projector : x.projector.rows(0, x.local_rows));
  return x.projector_operand;
}

void GaloreAdamW::project(Tensor& out, Matrix& x, float alpha) {
  if (x.side == GaloreSide::right)
    ops::matmul(out, gradient_operand(x), false, projector_operand(x), true, alpha, 0.0f,
                precision());
  else
    ops::matmul(out, projector_operand(x), true, gradient_operand(x), false, alpha, 0.0f,
                precision());
}

StepReport GaloreAdamW::begin_step(double lr, int64_t step, const StepCollectives& collectives) {
  FRUGAL_CHECK(step >= 1, "GaloreAdamW step ", step, " (1-based)");
  for (Matrix& x : matrices_) x.projector_operand = Tensor();  // a step left unfinished
  if (galore_.projected_replica_sums && collectives.replicas > 1) {
    lr_ = lr;
    step_ = step;
    return begin_step_across_replicas(collectives);
  }
  std::vector<Tensor> grads;
  for (const TrainableShard& s : shards_) grads.push_back(s.grad);
  StepReport report;
  report.grad_norm = std::sqrt(collectives.sum(collectives.local_sum_squares(grads)));
  if (adamw_.grad_clip > 0 && report.grad_norm > adamw_.grad_clip)
    report.clip_scale = adamw_.grad_clip / (report.grad_norm + 1e-6);
  lr_ = lr;
  step_ = step;
  clip_scale_ = report.clip_scale;
  // Gradients with a NaN or an inf would poison the projectors: the step is skipped whole.
  if (!std::isfinite(report.grad_norm)) return report;

  // Every gradient shard arrived summed over the replicas (if any): nothing more crosses them.
  StepCollectives summed = collectives;
  summed.replica_sum_in_place = [](Tensor&) {};
  const int64_t t = step - 1;
  if (galore_.profile) ++profiled_steps_;
  const ops::TimeMark refresh_start = mark();
  advance_refreshes();
  InlineProgress progress = inline_progress(t);
  for (size_t j = 0; j < matrices_.size(); ++j) {
    if (!refresh_due(j, t)) continue;
    if (pipelined(t)) {
      begin_refresh(j, t, summed);
    } else {
      refresh(matrices_[j], t, summed);
      if (progress) progress->advance(1);
    }
  }
  submit_host_work();
  timed(Work::refresh, refresh_start);
  std::vector<size_t> all(matrices_.size());
  for (size_t j = 0; j < all.size(); ++j) all[j] = j;
  project_left(all, collectives);
  return report;
}

void GaloreAdamW::project_left(const std::vector<size_t>& js, const StepCollectives& collectives) {
  // The left side's projections P^T G: one sum over the ranks for all of them.
  int64_t total = 0;
  for (size_t j : js)
    if (matrices_[j].side == GaloreSide::left) total += matrices_[j].rank * matrices_[j].cols;
  if (total == 0) return;
  Tensor all;
  int64_t offset = 0;
  const ops::TimeMark projection_start = mark();
  for (size_t j : js) {
    Matrix& x = matrices_[j];
    if (x.side != GaloreSide::left) continue;
    if (!all.defined()) all = galore_scratch(x.projector, {total, 1}, *scratch_);
    const int64_t size = x.rank * x.cols;
    x.projected_grad = all.rows(offset, offset + size).view({x.rank, x.cols});
    offset += size;
    project(x.projected_grad, x, static_cast<float>(clip_scale_));
  }
  timed(Work::projection, projection_start);
  collectives.sum_in_place(all);
}

void GaloreAdamW::begin_per_layer_step(double lr, int64_t step) {
  FRUGAL_CHECK(step >= 1, "GaloreAdamW step ", step, " (1-based)");
  // A pipelined refresh advances all matrices at a step's start and installs projectors between
  // steps; the sums across replicas of projected gradients need every matrix's at once. Config
  // validation refuses both with per-layer updates (train_config.cpp).
  FRUGAL_CHECK(galore_.refresh != GaloreRefresh::pipelined && !galore_.projected_replica_sums,
               "GaLore's per-layer updates need galore.refresh = inline and no projected replica "
               "sums");
  for (Matrix& x : matrices_) x.projector_operand = Tensor();  // a step left unfinished
  lr_ = lr;
  step_ = step;
  clip_scale_ = 1;
  if (galore_.profile) ++profiled_steps_;
}

void GaloreAdamW::begin_slices(const std::vector<size_t>& slices, double clip_scale,
                               const StepCollectives& collectives) {
  FRUGAL_CHECK(step_ >= 1, "GaloreAdamW::begin_slices before begin_per_layer_step");
  clip_scale_ = clip_scale;
  StepCollectives summed = collectives;
  summed.replica_sum_in_place = [](Tensor&) {};
  const int64_t t = step_ - 1;
  std::vector<size_t> js;
  for (size_t k : slices) {
    FRUGAL_CHECK(k < shards_.size(), "GaloreAdamW slice ", k, " of ", shards_.size());
    if (matrix_of_[k] >= 0) js.push_back(size_t(matrix_of_[k]));
  }
  // The refreshes due among this unit's matrices, inline, then its left projections: the same
  // products as begin_step's, summed over the ranks per unit.
  const ops::TimeMark refresh_start = mark();
  for (size_t j : js)
    if (refresh_due(j, t)) refresh(matrices_[j], t, summed);
  timed(Work::refresh, refresh_start);
  project_left(js, collectives);
}

StepReport GaloreAdamW::begin_step_across_replicas(const StepCollectives& collectives) {
  const int64_t t = step_ - 1;
  // The refreshes first (a projector does not depend on the clipping factor). A randomized
  // range finder's products with G are linear in it: each crosses the replicas (a few columns).
  // The Gram of the exact one is not: its matrix's whole gradient rows do, once.
  StepCollectives summed = collectives;
  summed.replica_sum_in_place = [](Tensor&) {};
  std::vector<bool> whole(matrices_.size(), false);  // gradient rows summed over the replicas
  if (galore_.profile) ++profiled_steps_;
  const ops::TimeMark refresh_start = mark();
  advance_refreshes();
  InlineProgress progress = inline_progress(t);
  for (size_t j = 0; j < matrices_.size(); ++j) {
    if (!refresh_due(j, t)) continue;
    Matrix& x = matrices_[j];
    if (galore_.projector.kind == GaloreProjectorKind::svd) {
      Tensor rows = shards_[x.shard].grad.rows(0, x.local_rows);
      collectives.replica_sum_in_place(rows);
      whole[j] = true;
    }
    if (pipelined(t)) {
      begin_refresh(j, t, whole[j] ? summed : collectives);
    } else {
      refresh(x, t, whole[j] ? summed : collectives);
      if (progress) progress->advance(1);
    }
  }
  submit_host_work();
  timed(Work::refresh, refresh_start);

  // The projections, before clipping: right R = G Q^T (row-local: summed over the replicas),
  // left R = P^T G (summed over the shard group, then over the replicas); neither crosses the
  // replicas where the gradient rows already did. Each group of them is one buffer and one
  // collective: 0 right, 1 right of whole rows, 2 left, 3 left of whole rows.
  int64_t sizes[4] = {0, 0, 0, 0};
  const auto group_of = [&](size_t j) {
    return (matrices_[j].side == GaloreSide::right ? 0 : 2) + (whole[j] ? 1 : 0);
  };
  const auto size_of = [](const Matrix& x) {
    return x.side == GaloreSide::right ? x.local_rows * x.rank : x.rank * x.cols;
  };
  for (size_t j = 0; j < matrices_.size(); ++j) sizes[group_of(j)] += size_of(matrices_[j]);
  Tensor buffers[4];
  int64_t offsets[4] = {0, 0, 0, 0};
  const ops::TimeMark projection_start = mark();
  for (size_t j = 0; j < matrices_.size(); ++j) {
    Matrix& x = matrices_[j];
    const int group = group_of(j);
    if (!buffers[group].defined())
      buffers[group] =
          galore_scratch(x.projector, {std::max<int64_t>(1, sizes[group]), 1}, *scratch_);
    const int64_t size = size_of(x);
    Tensor r = buffers[group].rows(offsets[group], offsets[group] + size);
    offsets[group] += size;
    if (x.side == GaloreSide::right) {
      x.projected_grad = r.view({x.local_rows, x.rank});
      if (x.local_rows > 0) project(x.projected_grad, x, 1.0f);
    } else {
      x.projected_grad = r.view({x.rank, x.cols});
      project(x.projected_grad, x, 1.0f);
    }
  }
  timed(Work::projection, projection_start);
  for (int group : {2, 3})
    if (buffers[group].defined()) collectives.sum_in_place(buffers[group]);
  for (int group : {0, 2})
    if (buffers[group].defined()) collectives.replica_sum_in_place(buffers[group]);

  // The norm: the other weights' gradient shards (summed over the replicas by ZeRO-3) and the
  // right side's projected rows, summed over the shard group; the left side's projections are
  // whole on every rank.
  std::vector<Tensor> local, replicated;
  for (size_t k = 0; k < shards_.size(); ++k)
    if (matrix_of_[k] < 0) local.push_back(shards_[k].grad);
  for (const Matrix& x : matrices_)
    (x.side == GaloreSide::right ? local : replicated).push_back(x.projected_grad);
  StepReport report;
  report.grad_norm =
      std::sqrt(collectives.sum(ops::sum_squares(local)) + ops::sum_squares(replicated));
  if (adamw_.grad_clip > 0 && report.grad_norm > adamw_.grad_clip)
    report.clip_scale = adamw_.grad_clip / (report.grad_norm + 1e-6);
  clip_scale_ = report.clip_scale;
  if (clip_scale_ != 1)
    for (Tensor& b : buffers)
      if (b.defined()) ops::scale_inplace(b, static_cast<float>(clip_scale_));
  return report;
}

ops::QuantizedMoment GaloreAdamW::moment_rows(const Matrix& x, const ops::QuantizedMoment& q) {
  if (x.side != GaloreSide::right) return q;
  ops::QuantizedMoment rows = q;
  rows.codes = q.codes.rows(0, x.local_rows);
  rows.absmax = q.absmax.rows(0, x.local_rows);
  return rows;
}

void GaloreAdamW::update(size_t k) {
  FRUGAL_CHECK(k < shards_.size(), "GaloreAdamW slice ", k, " of ", shards_.size());
  FRUGAL_CHECK(step_ >= 1, "GaloreAdamW::update before begin_step");
  if (matrix_of_[k] >= 0) return update_projected(matrices_[size_t(matrix_of_[k])]);
  TrainableShard& s = shards_[k];
  const ops::AdamWStep hyper = adamw_step(adamw_, s.name, lr_, step_, clip_scale_);
  const Bf16Store store = bf16_store(adamw_, s, step_);
  if (qm_[k].codes.defined())
    ops::adamw_int8_update(s.param, s.grad, qm_[k], qv_[k], hyper, s.param_copy, store);
  else
    ops::adamw_update(s.param, s.grad, m_[k], v_[k], hyper, s.param_copy, store);
}

void GaloreAdamW::update_projected(Matrix& x) {
  TrainableShard& s = shards_[x.shard];
  const int64_t rows = x.local_rows, r = x.rank;
  const bool right = x.side == GaloreSide::right;
  // This step's projected gradient: right, row-local R = G Q^T; left, made by begin_step.
  Tensor projected;
  ops::TimeMark start = mark();
  if (right && !x.projected_grad.defined()) {
    projected = galore_scratch(x.projector, {rows, r}, *scratch_);
    project(projected, x, static_cast<float>(clip_scale_));
    timed(Work::projection, start);
    start = mark();
  } else {
    projected = x.projected_grad;
  }
  x.projected_grad = Tensor();
  if (x.exp_avg_int8.codes.defined()) {
    ops::QuantizedMoment m = moment_rows(x, x.exp_avg_int8);
    ops::QuantizedMoment v = moment_rows(x, x.exp_avg_sq_int8);
    ops::galore_moments_int8(m, v, projected, static_cast<float>(adamw_.beta1),
                             static_cast<float>(adamw_.beta2), static_cast<float>(adamw_.eps));
  } else {
    Tensor m = right ? x.exp_avg.rows(0, rows) : x.exp_avg;
    Tensor v = right ? x.exp_avg_sq.rows(0, rows) : x.exp_avg_sq;
    ops::galore_moments(m, v, projected, static_cast<float>(adamw_.beta1),
                        static_cast<float>(adamw_.beta2), static_cast<float>(adamw_.eps));
  }
  timed(Work::moments, start);

  // Bias corrections count the moments' updates: every step, or since the last reset.
  const int64_t t = step_ - 1;
  const size_t j = size_t(matrix_of_[x.shard]);
  const int64_t updates =
      galore_.moments_on_refresh == MomentsOnRefresh::reset ? t - last_refresh(j, t) + 1 : step_;
  const double correction1 = 1.0 - std::pow(adamw_.beta1, double(updates));
  const double correction2 = 1.0 - std::pow(adamw_.beta2, double(updates));
  const double step_size = lr_ * std::sqrt(correction2) / correction1;
  const double decay = decays(s.name) ? -lr_ * adamw_.weight_decay : 0.0;

  // Back to the weight's rows, scaled, N Q or P N; the update (the reference's, decay after the
  // step) is W <- (1 + decay) (W - step_size scale step_back).
  start = mark();
  Tensor param = s.param.rows(0, rows);
  Tensor copy = s.param_copy.defined() ? s.param_copy.rows(0, rows) : Tensor();
  const Tensor left_factor = right ? operand(projected) : projector_operand(x);
  const Tensor right_factor = right ? projector_operand(x) : operand(projected);
  x.projector_operand = Tensor();
  if (param.dtype() == DType::f32) {
    // One GEMM whose epilogue reads and writes W: no step_back in memory.
    const double keep = 1.0 + decay;
    ops::matmul(param, left_factor, false, right_factor, false,
                static_cast<float>(-keep * step_size * galore_.scale), static_cast<float>(keep),
                precision());
    timed(Work::projection, start);
    start = mark();
    if (copy.defined()) ops::assign(copy, param);
  } else {
    Tensor step_back = galore_scratch(x.projector, {rows, x.cols}, *scratch_);
    ops::matmul(step_back, left_factor, false, right_factor, false,
                static_cast<float>(galore_.scale), 0.0f, precision());
    timed(Work::projection, start);
    start = mark();
    ops::galore_apply(param, step_back, static_cast<float>(-step_size), static_cast<float>(decay),
                      copy, bf16_store(adamw_, s, step_));
  }
  timed(Work::moments, start);
}

ops::MatmulPrecision GaloreAdamW::precision() const {
  // Of f32 operands (bf16 ones carry their precision in their dtype).
  return galore_.precision == GaloreProjectionPrecision::tf32 ? ops::MatmulPrecision::tf32
                                                              : ops::MatmulPrecision::fp32;
}

ops::TimeMark GaloreAdamW::mark() const {
  if (!galore_.profile || matrices_.empty()) return ops::TimeMark();
  return ops::TimeMark(matrices_.front().projector.device());
}

void GaloreAdamW::timed(Work work, const ops::TimeMark& start) {
  if (!galore_.profile || matrices_.empty()) return;
  Span span{work, start, mark()};
  const std::lock_guard<std::mutex> lock(spans_mutex_);
  spans_.push_back(std::move(span));
}

nlohmann::json GaloreAdamW::take_profile() {
  if (!galore_.profile) return nullptr;
  double ms[size_t(Work::kinds)] = {};
  std::vector<Span> spans;
  {
    const std::lock_guard<std::mutex> lock(spans_mutex_);
    spans.swap(spans_);
  }
  for (const Span& s : spans) ms[size_t(s.work)] += s.end.ms_since(s.start);
  const double steps = double(std::max<int64_t>(1, profiled_steps_));
  nlohmann::json out = {{"steps", profiled_steps_},
                        {"refreshes", profiled_refreshes_},
                        {"refresh_ms", ms[size_t(Work::refresh)] / steps},
                        {"projection_ms", ms[size_t(Work::projection)] / steps},
                        {"moments_ms", ms[size_t(Work::moments)] / steps}};
  profiled_steps_ = 0;
  profiled_refreshes_ = 0;
  return out;
}

std::vector<StateTensor> GaloreAdamW::state_tensors() {
  std::vector<StateTensor> state;
  for (size_t k = 0; k < shards_.size(); ++k) {
    const TrainableShard& s = shards_[k];
    if (matrix_of_[k] < 0) {
      if (qm_[k].codes.defined()) {
        append_quantized_state(state, "optim/exp_avg/" + s.name, qm_[k], s.rows);
        append_quantized_state(state, "optim/exp_avg_sq/" + s.name, qv_[k], s.rows);
        continue;
      }
      state.push_back({"optim/exp_avg/" + s.name, m_[k], s.rows});
      state.push_back({"optim/exp_avg_sq/" + s.name, v_[k], s.rows});
      continue;
    }
    const Matrix& x = matrices_[size_t(matrix_of_[k])];
    const int64_t r = x.rank;
    // Rows of [m, r] as the weight's rows, or a whole replicated [r, n].
    RowShard weight_rows = s.rows;
    weight_rows.full_shape = {x.rows, r};
    const RowShard moment_rows =
        x.side == GaloreSide::right ? weight_rows : whole_rows({r, x.cols}, true);
    const RowShard projector_rows =
        x.side == GaloreSide::right ? whole_rows({r, x.cols}, true) : weight_rows;
    if (x.exp_avg_int8.codes.defined()) {
      append_quantized_state(state, "optim/galore/exp_avg/" + s.name, x.exp_avg_int8, moment_rows);
      append_quantized_state(state, "optim/galore/exp_avg_sq/" + s.name, x.exp_avg_sq_int8,
                             moment_rows);
    } else {
      state.push_back({"optim/galore/exp_avg/" + s.name, x.exp_avg, moment_rows});
      state.push_back({"optim/galore/exp_avg_sq/" + s.name, x.exp_avg_sq, moment_rows});
    }
    state.push_back({"optim/galore/projector/" + s.name, x.projector, projector_rows});
  }
  return state;
}

nlohmann::json GaloreAdamW::state_values() const {
  return {{"rank", galore_.projector.rank}, {"update_proj_gap", galore_.update_proj_gap}};
}

void GaloreAdamW::load_state_values(const nlohmann::json& values) {
  if (!values.is_object() || !values.contains("rank"))
    fail("it has no GaLore state (was it trained with optim.type = adamw?)");
  if (values["rank"].get<int64_t>() != galore_.projector.rank)
    fail("its GaLore rank is ", values["rank"].dump(), " but galore.rank is ",
         galore_.projector.rank);
  // Another update_proj_gap is allowed: the schedule goes on from the loaded projectors.
}

GaloreAdamW::StateBytes GaloreAdamW::state_bytes() const {
  StateBytes b;
  for (size_t k = 0; k < shards_.size(); ++k) {
    b.adamw_equivalent += 2 * shards_[k].param.bytes();
    const auto bytes = [](const Tensor& t) { return t.defined() ? t.bytes() : size_t{0}; };
    const auto int8_bytes = [&](const ops::QuantizedMoment& q) {
      return bytes(q.codes) + bytes(q.absmax);
    };
    if (matrix_of_[k] < 0) {
      b.adamw_moments += bytes(m_[k]) + bytes(v_[k]) + int8_bytes(qm_[k]) + int8_bytes(qv_[k]);
      continue;
    }
    const Matrix& x = matrices_[size_t(matrix_of_[k])];
    b.projected_moments += bytes(x.exp_avg) + bytes(x.exp_avg_sq) + int8_bytes(x.exp_avg_int8) +
                           int8_bytes(x.exp_avg_sq_int8);
    b.projectors += x.projector.bytes();
  }
  return b;
}

}  // namespace frugal
