// A block's projections with their biases, LoRA adapters and FP8 casts; see block_projection.h.
#include "model/block_projection.h"

#include "core/random.h"

namespace frugal {

namespace {

// The adapter's input: x, or while training with lora.dropout, x through dropout with a mask
// of its own per (micro-batch, block, projection), drawn again in the backward.
bool adapter_dropout(const BlockContext& ctx) {
  return ctx.lora->dropout > 0 && ctx.noise_seed != 0;
}
uint64_t adapter_seed(const BlockContext& ctx, int p) {
  uint64_t state = ctx.noise_seed ^ (ctx.lora->seed * 0xD1B54A32D192ED03ull) ^ uint64_t(p + 1);
  return splitmix64(state);
}
// x's first element's index in the whole [tokens, width] input: a chunk of rows draws the mask
// the whole would.
int64_t first_element(const Tensor& x, const BlockContext& ctx) {
  return ctx.first_row * (x.numel() / std::max<int64_t>(1, x.size(0)));
}
Tensor adapter_input(const Tensor& x, const BlockContext& ctx, int p) {
  if (!adapter_dropout(ctx)) return x;
  return ops::dropout(x, static_cast<float>(ctx.lora->dropout), adapter_seed(ctx, p),
                      first_element(x, ctx));
}

bool in_fp8(const BlockContext& ctx, int p) { return ctx.fp8 && ctx.fp8->covers(p); }
Fp8Linear fp8_linear_of(const BlockContext& ctx, int p) { return {ctx.fp8, ctx.layer, p}; }
// The weight an FP8 linear reads, as the forward (W) or the dgrad (W^T, `transposed`) needs it:
// codes from the provider (gathered as FP8, or 4-bit decoded straight to E4M3), else the weight
// to cast.
Fp8Weight fp8_weight_of(const BlockWeights& w, const BlockContext& ctx, int p, bool transposed) {
  std::optional<ops::Fp8Matrix> codes =
      w.fp8_projection(p, ctx.fp8->weight(ctx.layer, p), transposed);
  return codes ? Fp8Weight(std::move(*codes)) : Fp8Weight(w.projection(p));
}

}  // namespace

// The scale goes on t ([T, r]) rather than on the [T, out] update, which saves a pass over the
// projection's output.
Tensor adapter_t(const Tensor& x, const BlockWeights& w, int p, const BlockContext& ctx) {
  Tensor t = ops::linear(adapter_input(x, ctx, p), w.lora_a[p]);
  ops::scale_inplace(t, ctx.lora->scale());
  return t;
}

Tensor project(const Tensor& x, const BlockWeights& w, int p, const BlockContext& ctx,
               BlockActivations& a, Fp8InputCasts& casts, const Tensor& residual) {
  Tensor y;
  if (in_fp8(ctx, p)) {
    y = fp8_linear(x, fp8_weight_of(w, ctx, p, false), fp8_linear_of(ctx, p), casts);
    if (residual.defined()) ops::add_inplace(y, residual);
  } else {
    y = ops::linear(x, w.projection(p), residual);
  }
  if (w.bias[p].defined()) ops::add_bias(y, w.bias[p]);
  if (!w.lora_a[p].defined()) return y;
  a.lora_t[p] = adapter_t(x, w, p, ctx);
  ops::add_inplace(y, ops::linear(a.lora_t[p], w.lora_b[p]));
  return y;
}

Tensor project_backward(const Tensor& dy, const Tensor& x, const BlockWeights& w, BlockWeights& g,
                        int p, const BlockContext& ctx, const BlockActivations& a,
                        Fp8InputCasts& casts, Tensor* dx_sum) {
  Tensor dx;
  // Overwritten gradients come only with one write each (GradSums::kOnce): no FP8, bias or
  // adapter ops, which add.
  FRUGAL_CHECK(g.write == GradWrite::kAdd ||
                   (!in_fp8(ctx, p) && !g.bias[p].defined() && !w.lora_a[p].defined()),
               "projection ", p, ": overwritten gradients with an op that adds into them");
  if (in_fp8(ctx, p)) {
    dx = fp8_linear_backward(dy, x, fp8_weight_of(w, ctx, p, true), g.at(p), fp8_linear_of(ctx, p),
                             casts);
    if (dx_sum) {
      ops::add_inplace(*dx_sum, dx);
      dx = *dx_sum;
    }
  } else {
    dx = ops::linear_backward(dy, x, w.projection(p), g.at(p), dx_sum, g.write);
  }
  if (g.bias[p].defined()) ops::bias_backward(dy, g.bias[p]);  // not frozen
  if (!w.lora_a[p].defined()) return dx;
  // dB += dy^T t (t already scaled); dt = dy B, then d(d(x) A^T) = s dt, small.
  Tensor dt = ops::linear_backward(dy, a.lora_t[p], w.lora_b[p], g.lora_b[p]);
  ops::scale_inplace(dt, ctx.lora->scale());
  Tensor d_input = ops::linear_backward(dt, adapter_input(x, ctx, p), w.lora_a[p], g.lora_a[p]);
  // Dropout is linear and its own adjoint: the same mask carries the gradient back.
  if (adapter_dropout(ctx))
    d_input = ops::dropout(d_input, static_cast<float>(ctx.lora->dropout), adapter_seed(ctx, p),
                           first_element(d_input, ctx));
  ops::add_inplace(dx, d_input);
  return dx;
}

}  // namespace frugal
