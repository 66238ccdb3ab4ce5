// FP8 delayed scaling across ranks: each rank casts different data into the same tensor's slot
// (data-parallel ranks reading different sequences); after end_step with the communicator's
// max, every rank holds the same scale, max / amax over all ranks' data (checked against the
// ranks' amaxes gathered and maxed in float64), and the history rolls on each rank alike.
#include <algorithm>
#include <cmath>
#include <vector>

#include "catch_compat.h"
#include "core/random.h"
#include "model/fp8_scaling.h"
#include "ops/fp8.h"
#include "parallel/comm.h"

using namespace frugal;

namespace {

// Rank r's activations: uniform in +-(1 + r) * 0.7, so the largest rank decides the amax.
Tensor rank_data(int rank, int64_t rows, int64_t cols, uint64_t seed) {
  Tensor x = Tensor::empty({rows, cols});
  uint64_t state = seed * 1000 + uint64_t(rank);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = float((2 * uniform01(state) - 1) * (1 + rank) * 0.7);
  return x;
}

double local_amax(const Tensor& x) {
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) m = std::max(m, std::fabs(double(x.data<float>()[i])));
  return m;
}

}  // namespace

TEST_CASE("fp8 delayed scaling: the amax is reduced over the ranks that share the tensor",
          "[fp8]") {
  auto comm = make_mpi_world_comm(60);
  Fp8Settings settings;
  settings.enabled = true;
  settings.recipe = Fp8Recipe::delayed;
  settings.amax_history_len = 2;
  settings.margin = 1;
  settings.linears = {kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj};
  Fp8Scaling scaling(settings, /*layers=*/2, host_arena());
  const auto reduce = [&](Tensor& amax) { comm->all_reduce_max(amax)->wait(); };

  std::vector<double> global_amax_by_step;
  for (uint64_t step = 1; step <= 3; ++step) {
    // Layer 1's gate input; step 3 casts smaller values, so the history's older max stays.
    const double shrink = step == 3 ? 0.25 : 1.0;
    Tensor x = rank_data(comm->rank(), 48, 32, step);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= float(shrink);
    ops::fp8_cast(x, scaling.input(1, kGateProj), true, false);
    // What every rank's amax was, independently: all-gathered, max in float64.
    Tensor mine = Tensor::empty({1}, DType::f64);
    mine.data<double>()[0] = local_amax(x);
    Tensor all = Tensor::empty({comm->size()}, DType::f64);
    comm->all_gather(mine, all)->wait();
    global_amax_by_step.push_back(*std::max_element(all.data<double>(), all.data<double>() + comm->size()));

    scaling.end_step(reduce);
    // The window of 2: this step's and the last one's.
    const size_t n = global_amax_by_step.size();
    const double amax = std::max(global_amax_by_step[n - 1], n > 1 ? global_amax_by_step[n - 2] : 0);
    const float want = std::ldexp(448.0f / float(amax), -1);
    const ops::Fp8Slot slot = scaling.input(1, kGateProj);
    CHECK(slot.scale.data<float>()[0] == want);
    CHECK(slot.scale_inv.data<float>()[0] == 1.0f / want);
    CHECK(slot.amax.data<float>()[0] == 0.0f);  // cleared for the next step
    // The same on every rank.
    CHECK(comm->all_reduce_sum(double(want)) == comm->size() * double(want));
    // A slot nothing was cast into keeps its scale of 1.
    CHECK(scaling.weight(0, kQProj).scale.data<float>()[0] == 1.0f);
  }
  // The counts saw every rank's own values.
  const std::vector<Fp8Scaling::Counts> counts = scaling.take_counts();
  int64_t values = 0;
  for (const auto& c : counts)
    if (c.layer == 1 && c.role == Fp8Role::activation) values = c.values;
  CHECK(values == 3 * 48 * 32);
  for (const auto& c : scaling.take_counts()) CHECK(c.values == 0);  // taken means zeroed
}
