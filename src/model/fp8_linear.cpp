// FP8 block linears; see fp8_linear.h.
#include "model/fp8_linear.h"

namespace frugal {

namespace {

// The 2-d view of an activation [T, ..., K] as [T', K].
Tensor as_matrix(const Tensor& t) { return t.view({t.numel() / t.size(-1), t.size(-1)}); }

const ops::Fp8Matrix& input_cast(const Tensor& x, const Fp8Linear& l, Fp8InputCasts& inputs,
                                 bool transposed) {
  std::optional<ops::Fp8Matrix>& cached = inputs.casts[size_t(Fp8Scaling::input_index(l.p))];
  if (!cached) {
    ops::Fp8Cast cast =
        ops::fp8_cast(as_matrix(x), l.scaling->input(l.layer, l.p), !transposed, transposed);
    cached = transposed ? cast.transposed : cast.plain;
  }
  return *cached;
}

}  // namespace

Tensor fp8_linear(const Tensor& x, const Fp8Weight& w, const Fp8Linear& l, Fp8InputCasts& inputs) {
  const ops::Fp8Matrix& xq = input_cast(x, l, inputs, /*transposed=*/false);
  const ops::Fp8Matrix wq =
      w.codes ? *w.codes : ops::fp8_cast(w.w, l.scaling->weight(l.layer, l.p), true, false).plain;
  return ops::fp8_gemm(xq, wq, /*fast_accumulation=*/true);
}

Tensor fp8_linear_backward(const Tensor& dy, const Tensor& x, const Fp8Weight& w, Tensor& dw,
                           const Fp8Linear& l, Fp8InputCasts& inputs) {
  const bool weight_gradient = dw.defined();
  const ops::Fp8Cast dyq =
      ops::fp8_cast(as_matrix(dy), l.scaling->gradient(l.layer, l.p), true, weight_gradient);
  const ops::Fp8Matrix wq_t =
      w.codes ? *w.codes
              : ops::fp8_cast(w.w, l.scaling->weight(l.layer, l.p), false, true).transposed;
  // dx [T, K] = dy [T, N] . (W^T [K, N])^T
  Tensor dx = ops::fp8_gemm(dyq.plain, wq_t, /*fast_accumulation=*/false);
  if (weight_gradient) {
    // dW [N, K] += dy^T [N, T] . (x^T [K, T])^T
    const ops::Fp8Matrix& xq_t = input_cast(x, l, inputs, /*transposed=*/true);
    ops::fp8_gemm_accumulate(dw, dyq.transposed, xq_t, /*fast_accumulation=*/false);
  }
  return dx;
}

}  // namespace frugal
