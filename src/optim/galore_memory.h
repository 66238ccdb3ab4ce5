// What GaLore's temporaries take on a rank, from the shapes, for the memory plan: the state
// itself (moments, projectors) is galore_state_bytes (plan/memory_plan.h); this is what comes
// and goes around it during a step, which on a 7B model at rank 1024 is gigabytes (a pipelined
// refresh holds its gradient snapshot and the range finder's matrices for several steps, and
// a dozen of them overlap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "optim/galore_adamw.h"

namespace frugal {

// A projected matrix as a rank holds it: its full shape and how many of its rows (ZeRO-3's row
// shard; ceil(rows / ranks) at most).
struct GaloreMatrixRows {
  Shape full;
  int64_t rows = 0;
};

// An upper bound of the bytes GaLore's temporaries hold at once on a rank. `device`: where the
// gradients are (a GPU; host memory on the CPU backend): the step's left-side projections P^T G
// (summed over the ranks in one buffer; with projected_replica_sums the right side's R too),
// the larger of one update's temporaries (R = G Q^T; the step back N Q or P N, unless it goes
// straight into an f32 weight; the gradient in the operands' dtype; bf16 copies of the
// projector and N) and of an installation's moment rotation,
// and the refreshes: with refresh = pipelined as many as the staggered schedule overlaps (each
// holding its gradient snapshot, its new projector and the range finder's or the Gram's
// matrices), else one at a time. `host`: the float64 copies the refreshes factorise (and their
// f32 staging), for the same refreshes. The matrices are in the optimizer's (forward) order,
// which sets their refresh phases.
struct GaloreWorkingBytes {
  size_t device = 0, host = 0;
};
// bf16_state: the gradients and weights are bf16; host_products: the optimizer's products run on
// the host (the CPU backend, or offloaded state).
GaloreWorkingBytes galore_working_bytes(const std::vector<GaloreMatrixRows>& matrices,
                                        const GaloreConfig& config, bool bf16_state,
                                        bool host_products);

// The most refreshes in flight at once under refresh = pipelined: over the steps of one gap, the
// matrices whose refresh began fewer than its stages ago (GaloreAdamW's phases and
// galore_refresh_stages). 1 for refresh = immediate (each is computed within its step).
int64_t galore_refreshes_in_flight(const std::vector<GaloreMatrixRows>& matrices,
                                   const GaloreConfig& config);

}  // namespace frugal
