// The collectives of one rank alone, and the pass over the gradients the norm takes.
#include "optim/optimizer.h"

#include "ops/ops.h"

namespace frugal {

StepCollectives local_collectives() {
  return {[](double local) { return local; }, [](Tensor&) {}, 1, [](Tensor&) {}, {}};
}

double StepCollectives::local_sum_squares(const std::vector<Tensor>& grads) const {
  return gradient_pass ? gradient_pass(grads) : ops::sum_squares(grads);
}

}  // namespace frugal
