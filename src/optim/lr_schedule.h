// Learning-rate schedule: linear warm-up to the peak, then cosine decay to peak * min_ratio.
#pragma once

#include <cstdint>

namespace frugal {

struct LrSchedule {
  double peak = 0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_ratio = 0.1;

  // step is 1-based: the rate used by the step-th optimizer update.
  double at(int64_t step) const;
};

}  // namespace frugal
