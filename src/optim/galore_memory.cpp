// GaLore's temporaries from the shapes; see galore_memory.h. Each term follows the allocations
// of galore_adamw.cpp (update_projected, begin_step, rotate_moments, begin_refresh) and
// galore_projector.cpp (exact_projector, randomized_projector and their CholeskyQR passes), in
// f32 elements on the device and bytes on the host.
#include "optim/galore_memory.h"

#include <algorithm>

#include "optim/galore_projector.h"

namespace frugal {

namespace {

struct Elements {
  size_t device = 0;  // f32 elements where the gradients are
  size_t host = 0;    // bytes of host memory
};

Elements max_of(Elements a, Elements b) {
  return {std::max(a.device, b.device), std::max(a.host, b.host)};
}

// One refresh of x: `pipelined` holds a snapshot of the gradient rows and a new projector
// besides; an inline one reads the gradient as it is (widened to f32 first for a bf16 one) and
// writes the projector in place.
Elements refresh_elements(const GaloreMatrixRows& x, const GaloreConfig& c, bool pipelined,
                          bool widened) {
  const size_t m = size_t(x.full[0]), n = size_t(x.full[1]), rows = size_t(x.rows);
  const size_t r = size_t(galore_rank_of(x.full, c.projector.rank));
  const bool right = galore_side(x.full) == GaloreSide::right;
  const size_t projector = right ? r * n : rows * r;
  Elements e;
  e.device = (pipelined || widened ? rows * n : 0) + (pipelined ? projector : 0);
  if (c.projector.kind == GaloreProjectorKind::svd) {
    // The Gram G^T G [n, n]; then the vectors where the projector lives: V^T [r, n] (right) or
    // V Sigma^-1 [n, r] (left). Host: the Gram's f32 copy and float64 twin, the eigenvectors
    // [r, n] and values in float64, and the f32 staging of what goes back.
    e.device += n * n + r * n;
    e.host = 12 * n * n + 8 * (r * n + n) + (right ? 4 * r * n : 12 * n * r);
    return e;
  }
  const size_t l = std::min(r + size_t(c.projector.oversampling), std::min(m, n));
  // Y [rows, l] throughout; beside it, the largest of: Omega [n, l]; a CholeskyQR pass on Y (its
  // Gram, R^-1 and the product); a power iteration (Z [n, l] and a pass on Z or on Y); then
  // B = Y^T G [l, n] with B B^T, or with the right side's last products (S^-1 W^T as f32, Q's
  // passes: [r, r] twice and [r, n]).
  const size_t pass_on_y = 2 * l * l + rows * l;
  size_t middle = std::max(n * l, pass_on_y);
  if (c.projector.power_iterations > 0)
    middle = std::max(middle, n * l + 2 * l * l + std::max(n * l, rows * l));
  const size_t tail = l * n + std::max(l * l, right ? r * l + 2 * r * r + r * n : r * l);
  e.device += rows * l + std::max(middle, tail);
  // Host: a pass's Gram in f32 and float64, R in float64 and R^-1 in f32 (24 l^2 bytes); or
  // B B^T's copies (12 l^2), its eigenvectors [r, l] and values, S^-1 W^T in float64 and as f32
  // (20 r l + 8 l); or Q's passes (24 r^2).
  e.host = std::max({24 * l * l, 12 * l * l + 20 * r * l + 8 * l, 24 * r * r});
  return e;
}

}  // namespace

int64_t galore_refreshes_in_flight(const std::vector<GaloreMatrixRows>& matrices,
                                   const GaloreConfig& config) {
  if (config.refresh != GaloreRefresh::pipelined || matrices.empty()) return 1;
  const int64_t gap = config.update_proj_gap, count = int64_t(matrices.size());
  // A refresh begun at step s is held through steps s .. s + stages - 1, or until the matrix's
  // next one begins: an interval of the gap's circle from the matrix's phase. The most that
  // overlap, by a sweep over the intervals' ends (a gap may be a billion steps long).
  std::vector<std::pair<int64_t, int>> ends;  // (step mod gap, +1 held from it / -1 free from it)
  for (int64_t j = 0; j < count; ++j) {
    GaloreProjectorSettings settings = config.projector;
    settings.rank = galore_rank_of(matrices[size_t(j)].full, config.projector.rank);
    const int64_t steps = std::min(galore_refresh_stages(matrices[size_t(j)].full, settings), gap);
    const int64_t first = galore_refresh_phase(j, count, config), last = first + steps;
    ends.push_back({first, +1});
    if (last <= gap) {
      ends.push_back({last, -1});
    } else {  // wraps around the gap
      ends.push_back({gap, -1});
      ends.push_back({0, +1});
      ends.push_back({last - gap, -1});
    }
  }
  std::sort(ends.begin(), ends.end());  // at one step, the frees (-1) before the starts
  int64_t held = 0, most = 0;
  for (const auto& [step, change] : ends) most = std::max(most, held += change);
  return most;
}

GaloreWorkingBytes galore_working_bytes(const std::vector<GaloreMatrixRows>& matrices,
                                        const GaloreConfig& config, bool bf16_state,
                                        bool host_products) {
  if (matrices.empty()) return {};
  // One buffer a step: P^T G [r, n] of every left-side matrix; under hybrid sharding's projected
  // replica sums every right-side R [rows, r] too (begin_step_across_replicas).
  size_t projections = 0;
  Elements update;  // the largest of one update's or one installation's temporaries
  Elements inline_refresh, pipelined_refresh;  // the largest refresh of each kind
  for (const GaloreMatrixRows& x : matrices) {
    const size_t n = size_t(x.full[1]), rows = size_t(x.rows);
    const size_t r = size_t(galore_rank_of(x.full, config.projector.rank));
    const bool right = galore_side(x.full) == GaloreSide::right;
    if (!right) projections += r * n;
    if (right && config.projected_replica_sums) projections += rows * r;
    // update_projected: R [rows, r] (right); the step back [rows, n] unless the product goes
    // straight into an f32 weight; the gradient as an operand (a bf16 copy of an f32 one, an f32
    // copy of a bf16 one); with bf16 operands, copies of the projector and of the step N.
    const bool bf16_operands = config.precision == GaloreProjectionPrecision::bf16;
    const size_t projector = right ? r * n : rows * r, step = right ? rows * r : r * n;
    const size_t gradient =
        bf16_operands ? (bf16_state ? 0 : (rows * n + 1) / 2) : (bf16_state ? rows * n : 0);
    size_t operands = bf16_operands ? (projector + step + 1) / 2 : 0;
    // The host multiplies bf16 operands widened back to f32 (ops::matmul): both, the gradient's
    // (or its f32 copy's) the larger.
    if (bf16_operands && host_products) operands += rows * n + std::max(projector, step);
    update.device = std::max(
        update.device, (right ? rows * r : 0) + (bf16_state ? rows * n : 0) + gradient + operands);
    // An installation with moments_on_refresh = project: the old projector, C [r, r] and one
    // rotated moment; C o C on the host in float64 and f32.
    if (config.moments_on_refresh == MomentsOnRefresh::project) {
      const size_t projector = right ? r * n : rows * r, moment = right ? rows * r : r * n;
      update = max_of(update, {projector + r * r + moment, 12 * r * r});
    }
    // The first projectors (step 0) and every refresh = immediate one are computed inline.
    inline_refresh = max_of(inline_refresh, refresh_elements(x, config, false, bf16_state));
    if (config.refresh == GaloreRefresh::pipelined)
      pipelined_refresh = max_of(pipelined_refresh, refresh_elements(x, config, true, bf16_state));
  }
  const size_t in_flight = size_t(galore_refreshes_in_flight(matrices, config));
  const Elements refreshes = max_of(
      inline_refresh, {in_flight * pipelined_refresh.device, in_flight * pipelined_refresh.host});
  return {4 * (projections + update.device + refreshes.device), update.host + refreshes.host};
}

}  // namespace frugal
