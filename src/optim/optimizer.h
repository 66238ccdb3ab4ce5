// What the step loop and the checkpoint manager ask of an optimizer. A step is two halves:
// begin_step, on the main thread, does every collective the step needs (the global gradient
// norm; GaLore's projections will all-reduce there too: MPI runs FUNNELED), then update(k)
// changes slice k alone, so that ZeRO-3 with a host optimizer may run the updates on a thread
// of its own beside the next forward. Its state (moments, projectors) is named tensors, each
// row-sharded like its parameter or replicated, which checkpoints save without knowing them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/stateful.h"

namespace frugal {

// Sums a rank-local value over every rank that holds part of the gradients (an MPI
// all-reduce under ZeRO-3; the identity on one rank).
using GlobalSum = std::function<double(double)>;

struct StepReport {
  double grad_norm = 0;   // before clipping
  double clip_scale = 1;  // factor applied to the gradients
};

class Optimizer : public Stateful {
 public:
  // The collectives and per-step scalars of step `step` (1-based) at learning rate `lr`.
  virtual StepReport begin_step(double lr, int64_t step, const GlobalSum& global_sum) = 0;
  // Updates trainable slice k (ParameterProvider::trainable()'s order), touching only its
  // tensors; after begin_step.
  virtual void update(size_t k) = 0;
  virtual size_t slices() const = 0;

  // begin_step, then every update, in order.
  StepReport step(double lr, int64_t step, const GlobalSum& global_sum) {
    const StepReport report = begin_step(lr, step, global_sum);
    for (size_t k = 0; k < slices(); ++k) update(k);
    return report;
  }
};

}  // namespace frugal
