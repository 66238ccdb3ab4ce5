// GaLore AdamW's subspace refreshes (galore_adamw.h): a matrix's new projector from its
// gradient, computed inline or spread over the gap on the host (galore.refresh), installed with
// its moments kept, reset or rotated into the new subspace (galore.moments_on_refresh).
#include <cmath>
#include <string>

#include "core/progress.h"
#include "ops/ops.h"
#include "optim/galore_adamw.h"
#include "optim/quantized_moments.h"

namespace frugal {

GaloreProjectorSettings GaloreAdamW::settings_of(const Matrix& x) const {
  GaloreProjectorSettings settings = galore_.projector;
  settings.rank = x.rank;  // the run's rank, or the matrix's smaller side
  settings.tf32 = galore_.precision != GaloreProjectionPrecision::fp32;
  return settings;
}

uint64_t GaloreAdamW::sketch_seed(const Matrix& x, int64_t t) const {
  // The sketch's seed: the run's, the matrix's name and the iteration (FNV-1a of the name).
  uint64_t seed = 0xCBF29CE484222325ull ^ galore_.seed;
  for (char ch : shards_[x.shard].name) seed = (seed ^ uint8_t(ch)) * 0x100000001B3ull;
  return seed ^ uint64_t(t) * 0x9E3779B97F4A7C15ull;
}

void GaloreAdamW::begin_refresh(size_t j, int64_t t, const StepCollectives& collectives) {
  // The matrix's previous refresh, if the gap is shorter than its stages, goes first.
  if (in_flight_[j]) complete_refresh(j);
  Matrix& x = matrices_[j];
  if (galore_.profile) ++profiled_refreshes_;
  auto f = std::make_unique<InFlight>();
  f->collectives = collectives;
  const Tensor rows = shards_[x.shard].grad.rows(0, x.local_rows);
  Tensor snapshot = galore_scratch(rows, rows.shape(), *scratch_);  // G_t, f32
  ops::assign(snapshot, rows);
  const Shape shape =
      x.side == GaloreSide::right ? Shape{x.rank, x.cols} : Shape{x.local_rows, x.rank};
  f->new_projector = galore_scratch(x.projector, shape, *scratch_);
  f->refresh = galore_projector_refresh(f->new_projector, std::move(snapshot), {x.rows, x.cols},
                                        settings_of(x), sketch_seed(x, t), collectives, *scratch_);
  in_flight_[j] = std::move(f);
}

void GaloreAdamW::advance_refreshes() {
  for (size_t j = 0; j < matrices_.size(); ++j) {
    InFlight* f = in_flight_[j].get();
    if (!f) continue;
    // Always waits for the host work (results never depend on timing), then the next stage.
    if (f->host.valid()) f->host.get();
    f->copies.clear();  // finished before their host work began
    if (!f->refresh.done()) f->refresh.resume();
    if (++f->stages_done >= matrices_[j].stages) complete_refresh(j);
  }
}

void GaloreAdamW::submit_host_work() {
  for (auto& f : in_flight_) {
    if (!f || f->refresh.done()) continue;
    RefreshHostWork& work = f->refresh.host_work();
    // The factorisations, pure host code, go to the worker once the stage's downloads have
    // arrived; the host does not wait for them here (on a GPU the hand-over runs on CUDA's
    // callback thread when the copies are done). The copies are kept until the next stage.
    auto promise = std::make_shared<std::promise<void>>();
    f->host = promise->get_future();
    f->copies = std::move(work.copies);
    const auto run_math = [math = work.math, promise] {
      try {
        if (math) math();
        promise->set_value();
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    };
    const auto hand_over = [worker = worker_.get(), run_math, promise] {
      try {
        worker->submit(run_math);
      } catch (...) {  // the worker could not take it: the main thread learns at get()
        promise->set_exception(std::current_exception());
      }
    };
    try {
      ops::after_side_copies(f->copies, hand_over);
    } catch (...) {
      // Not queued (a failed launch): whoever waits for this stage (the next step, the
      // destructor) must not wait for ever.
      promise->set_exception(std::current_exception());
      throw;
    }
  }
}

void GaloreAdamW::complete_refresh(size_t j) {
  std::unique_ptr<InFlight> f = std::move(in_flight_[j]);
  if (f->host.valid()) {
    f->host.get();
    f->copies.clear();
    f->refresh.resume();
  }
  f->refresh.finish();  // stages left over (a shifted CholeskyQR pass, an early completion)
  install(matrices_[j], f->new_projector, f->collectives);
}

void GaloreAdamW::before_save() {
  for (size_t j = 0; j < matrices_.size(); ++j)
    if (in_flight_[j]) complete_refresh(j);
}

void GaloreAdamW::replace_projector(Matrix& x, bool rotate, const StepCollectives& collectives,
                                    const std::function<void(Tensor&)>& write) {
  x.projector_operand = Tensor();
  Tensor old_projector;
  if (rotate) {  // (through ops: the projector may live on a GPU)
    old_projector = ops::empty_like(x.projector, x.projector.shape(), x.projector.dtype());
    ops::copy(old_projector, x.projector);
  }
  Tensor target = x.side == GaloreSide::right ? x.projector : x.projector.rows(0, x.local_rows);
  write(target);
  if (rotate) rotate_moments(x, old_projector, collectives);
}

void GaloreAdamW::install(Matrix& x, const Tensor& new_projector,
                          const StepCollectives& collectives) {
  replace_projector(x, galore_.moments_on_refresh == MomentsOnRefresh::project, collectives,
                    [&](Tensor& target) { ops::copy(target, new_projector); });
}

void GaloreAdamW::refresh(Matrix& x, int64_t t, const StepCollectives& collectives) {
  if (galore_.profile) ++profiled_refreshes_;
  replace_projector(x, t > 0 && galore_.moments_on_refresh == MomentsOnRefresh::project,
                    collectives, [&](Tensor& target) {
                      galore_projector(target, gradient_rows(x), {x.rows, x.cols}, settings_of(x),
                                       sketch_seed(x, t), collectives, *scratch_);
                    });
  if (t > 0 && galore_.moments_on_refresh == MomentsOnRefresh::reset) {
    for (Tensor* t8 : {&x.exp_avg, &x.exp_avg_sq, &x.exp_avg_int8.codes, &x.exp_avg_int8.absmax,
                       &x.exp_avg_sq_int8.codes, &x.exp_avg_sq_int8.absmax})
      if (t8->defined()) ops::zero(*t8);
  }
}

// The moments' coordinates in the old subspace, carried into the new one by C, the [r, r]
// matrix of the two bases' inner products: right, full-space m = M Q_old, so M <- M C with
// C = Q_old Q_new^T; left, m = P_old M, so M <- C M with C = P_new^T P_old (a sum over the
// row shards). The second moment, read as the variances of independent coordinates, goes with
// the squares of C's entries: V <- V (C o C), or (C o C) V.
void GaloreAdamW::rotate_moments(Matrix& x, const Tensor& old_projector,
                                 const StepCollectives& collectives) {
  const int64_t r = x.rank;
  Tensor c = galore_scratch(x.projector, {r, r}, *scratch_);
  const bool right = x.side == GaloreSide::right;
  if (right) {
    ops::matmul(c, old_projector, false, x.projector, true);
  } else {
    ops::matmul(c, x.projector.rows(0, x.local_rows), true, old_projector.rows(0, x.local_rows),
                false);
    collectives.sum_in_place(c);
  }
  Tensor c_squared64 = host_f64(c);
  for (int64_t i = 0; i < r * r; ++i)
    c_squared64.data<double>()[i] *= c_squared64.data<double>()[i];
  const Tensor c_squared = f32_beside(c_squared64, c, *scratch_);
  const auto rotate = [&](Tensor& moment, const Tensor& by) {
    Tensor rotated = galore_scratch(moment, moment.shape(), *scratch_);
    if (right)
      ops::matmul(rotated, moment, false, by, false);
    else
      ops::matmul(rotated, by, false, moment, false);
    ops::copy(moment, rotated);
  };
  if (x.exp_avg_int8.codes.defined()) {
    // 8-bit moments: rotated in f32, then quantized again (one more rounding at a refresh).
    const auto rotate_int8 = [&](ops::QuantizedMoment& q, const Tensor& by, bool is_signed) {
      ops::QuantizedMoment rows = moment_rows(x, q);
      Tensor wide = galore_scratch(x.projector, rows.codes.shape(), *scratch_);
      ops::dequantize_moment(wide, rows, is_signed);
      rotate(wide, by);
      ops::quantize_moment(rows, wide, is_signed);
    };
    rotate_int8(x.exp_avg_int8, c, true);
    rotate_int8(x.exp_avg_sq_int8, c_squared, false);
    return;
  }
  Tensor m = right ? x.exp_avg.rows(0, x.local_rows) : x.exp_avg;
  Tensor v = right ? x.exp_avg_sq.rows(0, x.local_rows) : x.exp_avg_sq;
  rotate(m, c);
  rotate(v, c_squared);
}

}  // namespace frugal
