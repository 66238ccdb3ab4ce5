// The transformer block as a page of math; see llama_block.h for the equations.
#include "model/llama_block.h"

#include "core/random.h"
#include "model/fp8_linear.h"

namespace frugal {

BlockWeights BlockWeights::from_unit(const std::vector<Tensor>& u, const LoraConfig* lora) {
  const size_t adapters = lora && lora->enabled() ? 2 * lora->targets.size() : 0;
  const size_t biases = u.size() - std::min(u.size(), kBlockParamCount + adapters);
  FRUGAL_CHECK(
      u.size() == kBlockParamCount + adapters + biases && (biases == 0 || biases == kQkvBiasCount),
      "block unit with ", u.size(), " tensors, expected ", kBlockParamCount + adapters, " (+ ",
      kQkvBiasCount, " biases)");
  BlockWeights w{
      u[kInputNorm], u[kQProj],  u[kKProj],    u[kVProj], u[kOProj], u[kPostAttentionNorm],
      u[kGateProj],  u[kUpProj], u[kDownProj], {},        {},        {}};
  if (biases) {
    w.bias[kQProj] = u[kBlockParamCount];
    w.bias[kKProj] = u[kBlockParamCount + 1];
    w.bias[kVProj] = u[kBlockParamCount + 2];
  }
  for (int p = 0; adapters && p < kBlockParamCount; ++p)
    if (lora->adapts(p)) {
      w.lora_a[p] = u[biases + lora->a_index(p)];
      w.lora_b[p] = u[biases + lora->a_index(p) + 1];
    }
  return w;
}

Tensor& BlockWeights::at(int p) {
  switch (p) {
    case kInputNorm:
      return input_norm;
    case kQProj:
      return q_proj;
    case kKProj:
      return k_proj;
    case kVProj:
      return v_proj;
    case kOProj:
      return o_proj;
    case kPostAttentionNorm:
      return post_attention_norm;
    case kGateProj:
      return gate_proj;
    case kUpProj:
      return up_proj;
    case kDownProj:
      return down_proj;
  }
  fail("block parameter index ", p, " out of range");
}

Tensor BlockWeights::projection(int p) const {
  const Tensor& weight = at(p);
  if (weight.defined() || !provider) return weight;
  return provider->materialize(unit, static_cast<size_t>(p));
}

std::optional<ops::Fp8Matrix> BlockWeights::fp8_projection(int p) const {
  if (at(p).defined() || !provider) return std::nullopt;
  return provider->fp8_weight(unit, static_cast<size_t>(p));
}

namespace {

// [T, heads * head_dim] <-> [T, heads, head_dim]
Tensor split_heads(const Tensor& t, int64_t heads, int64_t head_dim) {
  return t.view({t.size(0), heads, head_dim});
}
Tensor merge_heads(const Tensor& t) { return t.view({t.size(0), t.size(1) * t.size(2)}); }

float eps_of(const BlockContext& ctx) { return static_cast<float>(ctx.config->rms_norm_eps); }

// The adapter's input: x, or while training with lora.dropout, x through dropout with a mask
// of its own per (micro-batch, block, projection), drawn again in the backward.
bool adapter_dropout(const BlockContext& ctx) {
  return ctx.lora->dropout > 0 && ctx.noise_seed != 0;
}
uint64_t adapter_seed(const BlockContext& ctx, int p) {
  uint64_t state = ctx.noise_seed ^ (ctx.lora->seed * 0xD1B54A32D192ED03ull) ^ uint64_t(p + 1);
  return splitmix64(state);
}
Tensor adapter_input(const Tensor& x, const BlockContext& ctx, int p) {
  if (!adapter_dropout(ctx)) return x;
  return ops::dropout(x, static_cast<float>(ctx.lora->dropout), adapter_seed(ctx, p));
}

// y = x W^T, plus t B^T where the projection has a LoRA adapter, t = s d(x) A^T (d: its
// dropout, s = alpha / r). t is kept; the scale goes on it ([T, r]) rather than on the
// [T, out] update, which saves a pass over the projection's output.
bool in_fp8(const BlockContext& ctx, int p) { return ctx.fp8 && ctx.fp8->covers(p); }
Fp8Linear fp8_linear_of(const BlockContext& ctx, int p) { return {ctx.fp8, ctx.layer, p}; }
// The weight an FP8 linear reads: the codes the provider gathered, else the weight to cast.
Fp8Weight fp8_weight_of(const BlockWeights& w, int p) {
  std::optional<ops::Fp8Matrix> codes = w.fp8_projection(p);
  return codes ? Fp8Weight(std::move(*codes)) : Fp8Weight(w.projection(p));
}

Tensor project(const Tensor& x, const BlockWeights& w, int p, const BlockContext& ctx,
               BlockActivations& a, Fp8InputCasts& casts) {
  Tensor y = in_fp8(ctx, p) ? fp8_linear(x, fp8_weight_of(w, p), fp8_linear_of(ctx, p), casts)
                            : ops::linear(x, w.projection(p));
  if (w.bias[p].defined()) ops::add_bias(y, w.bias[p]);
  if (!w.lora_a[p].defined()) return y;
  a.lora_t[p] = ops::linear(adapter_input(x, ctx, p), w.lora_a[p]);
  ops::scale_inplace(a.lora_t[p], ctx.lora->scale());
  ops::add_inplace(y, ops::linear(a.lora_t[p], w.lora_b[p]));
  return y;
}

// The backward of project: returns dx; dW (when not frozen), dA and dB accumulated.
Tensor project_backward(const Tensor& dy, const Tensor& x, const BlockWeights& w, BlockWeights& g,
                        int p, const BlockContext& ctx, const BlockActivations& a,
                        Fp8InputCasts& casts) {
  Tensor dx = in_fp8(ctx, p) ? fp8_linear_backward(dy, x, fp8_weight_of(w, p), g.at(p),
                                                   fp8_linear_of(ctx, p), casts)
                             : ops::linear_backward(dy, x, w.projection(p), g.at(p));
  if (g.bias[p].defined()) ops::bias_backward(dy, g.bias[p]);  // not frozen
  if (!w.lora_a[p].defined()) return dx;
  // dB += dy^T t (t already scaled); dt = dy B, then d(d(x) A^T) = s dt, small.
  Tensor dt = ops::linear_backward(dy, a.lora_t[p], w.lora_b[p], g.lora_b[p]);
  ops::scale_inplace(dt, ctx.lora->scale());
  Tensor d_input = ops::linear_backward(dt, adapter_input(x, ctx, p), w.lora_a[p], g.lora_a[p]);
  // Dropout is linear and its own adjoint: the same mask carries the gradient back.
  if (adapter_dropout(ctx))
    d_input = ops::dropout(d_input, static_cast<float>(ctx.lora->dropout), adapter_seed(ctx, p));
  ops::add_inplace(dx, d_input);
  return dx;
}
const ops::RotaryFrequencies& rotary_of(const BlockContext& ctx) {
  FRUGAL_CHECK(ctx.rotary != nullptr, "block context without a rotary table");
  return *ctx.rotary;
}

// Everything the forward computes, with every intermediate filled in.
Tensor forward_all(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx) {
  const LlamaConfig& c = *ctx.config;
  const int64_t d = c.attention_head_dim();
  Fp8InputCasts casts;  // FP8: n1 cast once for q, k, v; n2 once for gate, up
  a.n1 = ops::rmsnorm(a.x, w.input_norm, eps_of(ctx), &a.rstd1);
  a.q = split_heads(project(a.n1, w, kQProj, ctx, a, casts), c.num_attention_heads, d);
  a.k = split_heads(project(a.n1, w, kKProj, ctx, a, casts), c.num_key_value_heads, d);
  a.v = split_heads(project(a.n1, w, kVProj, ctx, a, casts), c.num_key_value_heads, d);
  a.q_rot = ops::rope(a.q, ctx.positions, rotary_of(ctx));
  a.k_rot = ops::rope(a.k, ctx.positions, rotary_of(ctx));
  const int64_t window = c.sliding_window;
  a.attn = ctx.attention ? ctx.attention->forward(a.q_rot, a.k_rot, a.v, ctx.batch, window)
                         : ops::attention(a.q_rot, a.k_rot, a.v, ctx.batch, window);
  a.h = ops::add(a.x, project(merge_heads(a.attn.out), w, kOProj, ctx, a, casts));

  a.n2 = ops::rmsnorm(a.h, w.post_attention_norm, eps_of(ctx), &a.rstd2);
  a.gate = project(a.n2, w, kGateProj, ctx, a, casts);
  a.up = project(a.n2, w, kUpProj, ctx, a, casts);
  a.act = ops::swiglu(a.gate, a.up);
  return ops::add(a.h, project(a.act, w, kDownProj, ctx, a, casts));
}

// Drop what the policy does not keep. The projections before rotary (q, k) are never needed
// by the backward (it differentiates through rope with the positions alone).
void keep_only(BlockActivations& a, CheckpointPolicy policy) {
  a.q = a.k = Tensor();
  if (policy == CheckpointPolicy::none) return;
  if (policy == CheckpointPolicy::full) {
    Tensor x = a.x;
    const double checksum = a.act_checksum;
    a = BlockActivations();
    a.x = x;
    a.act_checksum = checksum;
    return;
  }
  // selective keeps lora_t: recomputing them would need the inputs it drops.
  // selective: the cheap, elementwise results go; matmul, rotary and attention outputs stay.
  a.n1 = a.rstd1 = a.n2 = a.rstd2 = a.act = Tensor();
}

}  // namespace

Tensor block_forward(const Tensor& x, const BlockWeights& w, const BlockContext& ctx,
                     BlockActivations* saved) {
  BlockActivations a;
  a.x = x;
  Tensor y = forward_all(a, w, ctx);
  if (saved) {
    if (ctx.checksum_act) a.act_checksum = ops::sum_squares({a.act});
    keep_only(a, ctx.policy);
    *saved = std::move(a);
  }
  return y;
}

void block_recompute(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx) {
  switch (ctx.policy) {
    case CheckpointPolicy::none:
      return;
    case CheckpointPolicy::full:
      forward_all(a, w, ctx);
      break;
    case CheckpointPolicy::selective:
      a.n1 = ops::rmsnorm(a.x, w.input_norm, eps_of(ctx), &a.rstd1);
      a.n2 = ops::rmsnorm(a.h, w.post_attention_norm, eps_of(ctx), &a.rstd2);
      a.act = ops::swiglu(a.gate, a.up);
      break;
  }
  // As a kernel that is not deterministic would: the recompute differs from the forward.
  if (ctx.perturb_recompute) ops::scale_inplace(a.act, 1.0f + 1.0f / 64);
}

Tensor block_backward(const Tensor& dy, const BlockActivations& a, const BlockWeights& w,
                      BlockWeights& g, const BlockContext& ctx) {
  Fp8InputCasts casts;  // FP8: the transposed casts of n1 and n2, each made once
  // MLP: y = h + down(silu(gate) * up)
  Tensor d_act = project_backward(dy, a.act, w, g, kDownProj, ctx, a, casts);
  ops::SwigluGrads d_mlp = ops::swiglu_backward(d_act, a.gate, a.up);
  Tensor d_n2 = project_backward(d_mlp.dg, a.n2, w, g, kGateProj, ctx, a, casts);
  ops::add_inplace(d_n2, project_backward(d_mlp.du, a.n2, w, g, kUpProj, ctx, a, casts));
  Tensor dh =
      ops::rmsnorm_backward(d_n2, a.h, w.post_attention_norm, a.rstd2, g.post_attention_norm);
  ops::add_inplace(dh, dy);

  // Attention: h = x + o(attention(rope(q), rope(k), v))
  Tensor d_attn = project_backward(dh, merge_heads(a.attn.out), w, g, kOProj, ctx, a, casts);
  const Tensor d_out = d_attn.view(a.attn.out.shape());
  const int64_t window = ctx.config->sliding_window;
  ops::AttentionGrads d_qkv =
      ctx.attention
          ? ctx.attention->backward(d_out, a.q_rot, a.k_rot, a.v, a.attn, ctx.batch, window)
          : ops::attention_backward(d_out, a.q_rot, a.k_rot, a.v, a.attn, ctx.batch, window);
  Tensor dq = ops::rope_backward(d_qkv.dq, ctx.positions, rotary_of(ctx));
  Tensor dk = ops::rope_backward(d_qkv.dk, ctx.positions, rotary_of(ctx));
  Tensor d_n1 = project_backward(merge_heads(dq), a.n1, w, g, kQProj, ctx, a, casts);
  ops::add_inplace(d_n1, project_backward(merge_heads(dk), a.n1, w, g, kKProj, ctx, a, casts));
  ops::add_inplace(d_n1,
                   project_backward(merge_heads(d_qkv.dv), a.n1, w, g, kVProj, ctx, a, casts));
  Tensor dx = ops::rmsnorm_backward(d_n1, a.x, w.input_norm, a.rstd1, g.input_norm);
  ops::add_inplace(dx, dh);
  return dx;
}

}  // namespace frugal
