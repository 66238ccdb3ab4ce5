// GaLore's modes as the configuration names them (config/config_keys.cpp): which projector finds
// the subspace, and what a refresh does to the moments. Apart from the optimizer's headers so
// the configuration can name them without the optimizer.
#pragma once

#include "core/enum_names.h"

namespace frugal {

// galore.projector: the exact top-r singular vectors (the reference's torch.linalg.svd), or a
// randomized range finder (Halko, Martinsson and Tropp 2011) that costs a few GEMMs.
enum class GaloreProjectorKind { svd, randomized };
inline std::span<const EnumName<GaloreProjectorKind>> enum_names(GaloreProjectorKind) {
  static constexpr EnumName<GaloreProjectorKind> names[] = {
      {GaloreProjectorKind::svd, "svd"}, {GaloreProjectorKind::randomized, "randomized"}};
  return names;
}

// galore.moments_on_refresh: what a refresh does to the moments of the old subspace. keep is
// the reference (the coordinates carry over as they are, though the basis changed), project
// carries them into the new subspace (the first moment as a vector, the second as the variances
// of independent coordinates), reset zeroes them (and the bias correction restarts with them).
enum class MomentsOnRefresh { keep, project, reset };
inline std::span<const EnumName<MomentsOnRefresh>> enum_names(MomentsOnRefresh) {
  static constexpr EnumName<MomentsOnRefresh> names[] = {{MomentsOnRefresh::keep, "keep"},
                                                         {MomentsOnRefresh::project, "project"},
                                                         {MomentsOnRefresh::reset, "reset"}};
  return names;
}

// galore.refresh: how a refresh's float64 host factorisations meet the step. inline computes the
// new projector within the step that begins it, the GPU idle while the host factorises (the
// reference's behaviour); pipelined runs one stage of it per step, the host work on a worker
// thread beside the rest of the step, and installs the projector of G_t a fixed number of steps
// later (galore_refresh_stages), the old one serving until then.
enum class GaloreRefresh { immediate, pipelined };
inline std::span<const EnumName<GaloreRefresh>> enum_names(GaloreRefresh) {
  static constexpr EnumName<GaloreRefresh> names[] = {{GaloreRefresh::immediate, "inline"},
                                                      {GaloreRefresh::pipelined, "pipelined"}};
  return names;
}

// galore.precision: the operands of the per-step projections (R = G Q^T or P^T G, and
// the step back N Q or P N): fp32; TF32, rounded to 10 mantissa bits on the tensor cores (a GPU
// only: the CPU multiplies in fp32); or bf16, rounded to 8 bits on every device (galore-torch's
// operands in a bf16 run), at about twice TF32's rate. Products and sums are fp32 in each. The
// randomized range finder's products with the gradient run in TF32 unless this is fp32.
enum class GaloreProjectionPrecision { fp32, tf32, bf16 };
inline std::span<const EnumName<GaloreProjectionPrecision>> enum_names(GaloreProjectionPrecision) {
  static constexpr EnumName<GaloreProjectionPrecision> names[] = {
      {GaloreProjectionPrecision::fp32, "fp32"},
      {GaloreProjectionPrecision::tf32, "tf32"},
      {GaloreProjectionPrecision::bf16, "bf16"}};
  return names;
}

}  // namespace frugal
