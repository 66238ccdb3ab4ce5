// A block linear y = x W^T through FP8 GEMMs (TransformerEngine's HYBRID format): x and W cast to
// E4M3 for the forward (fast accumulation), the output gradient dy to E5M2 for
// dx = dy W (with W^T's codes) and dW += dy^T x (with the transposed codes of dy and x), both
// accumulated exactly. cuBLASLt's FP8 GEMMs take only operands contiguous along the reduced
// dimension, hence the transposed copies, written by the same pass as the casts.
#pragma once

#include <array>
#include <optional>

#include "core/tensor.h"
#include "model/fp8_scaling.h"
#include "ops/fp8.h"

namespace frugal {

// The casts of a block's inputs within one pass (forward, or backward), made once and shared by
// the projections that read the same tensor: q, k and v read n1; gate and up read n2.
struct Fp8InputCasts {
  std::array<std::optional<ops::Fp8Matrix>, 4> casts;  // by Fp8Scaling::input_index
};

// Which tensors of projection p of `layer` to cast, and where their scales are.
struct Fp8Linear {
  const Fp8Scaling* scaling = nullptr;
  int64_t layer = 0;
  int p = 0;
};

// The weight of a linear: in the compute dtype (cast here), or already E4M3 codes with the weight
// slot's scale (gathered as FP8 under ZeRO-3, or a 4-bit base decoded straight to E4M3: used as
// they came, no cast), [N, K] for fp8_linear and W^T's [K, N] for fp8_linear_backward.
struct Fp8Weight {
  Fp8Weight(Tensor weight) : w(std::move(weight)) {}  // NOLINT: a weight is a weight to cast
  Fp8Weight(ops::Fp8Matrix cast) : codes(std::move(cast)) {}  // NOLINT
  Tensor w;
  std::optional<ops::Fp8Matrix> codes;
};

// y [T, N] = x [T, K] . w [N, K]^T in the compute dtype.
Tensor fp8_linear(const Tensor& x, const Fp8Weight& w, const Fp8Linear& l, Fp8InputCasts& inputs);
// Returns dx = dy w; dw (f32, may be undefined for a frozen weight) += dy^T x. `inputs` keeps the
// transposed input casts of the backward pass. dx needs W^T's codes: a cast of w, or w's codes.
Tensor fp8_linear_backward(const Tensor& dy, const Tensor& x, const Fp8Weight& w, Tensor& dw,
                           const Fp8Linear& l, Fp8InputCasts& inputs);

}  // namespace frugal
