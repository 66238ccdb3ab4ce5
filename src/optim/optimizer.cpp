// The collectives of one rank alone.
#include "optim/optimizer.h"

namespace frugal {

StepCollectives local_collectives() {
  return {[](double local) { return local; }, [](Tensor&) {}, 1, [](Tensor&) {}};
}

}  // namespace frugal
