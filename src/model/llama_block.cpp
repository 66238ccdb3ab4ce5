// The transformer block as a page of math; see llama_block.h for the equations.
#include "model/llama_block.h"

namespace frugal {

CheckpointPolicy checkpoint_policy_from_name(const std::string& name) {
  if (name == "none") return CheckpointPolicy::none;
  if (name == "selective") return CheckpointPolicy::selective;
  if (name == "full") return CheckpointPolicy::full;
  fail("activation checkpoint policy '", name, "' is not one of none, selective, full");
}

std::string checkpoint_policy_name(CheckpointPolicy policy) {
  switch (policy) {
    case CheckpointPolicy::none:
      return "none";
    case CheckpointPolicy::selective:
      return "selective";
    case CheckpointPolicy::full:
      return "full";
  }
  return "?";
}

BlockWeights BlockWeights::from_unit(const std::vector<Tensor>& u) {
  FRUGAL_CHECK(u.size() == kBlockParamCount, "block unit with ", u.size(), " tensors");
  return {u[kInputNorm],         u[kQProj],    u[kKProj],  u[kVProj],   u[kOProj],
          u[kPostAttentionNorm], u[kGateProj], u[kUpProj], u[kDownProj]};
}

namespace {

// [T, heads * head_dim] <-> [T, heads, head_dim]
Tensor split_heads(const Tensor& t, int64_t heads, int64_t head_dim) {
  return t.view({t.size(0), heads, head_dim});
}
Tensor merge_heads(const Tensor& t) { return t.view({t.size(0), t.size(1) * t.size(2)}); }

float eps_of(const BlockContext& ctx) { return static_cast<float>(ctx.config->rms_norm_eps); }
float theta_of(const BlockContext& ctx) { return static_cast<float>(ctx.config->rope_theta); }

// Everything the forward computes, with every intermediate filled in.
Tensor forward_all(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx) {
  const LlamaConfig& c = *ctx.config;
  const int64_t d = c.attention_head_dim();
  a.n1 = ops::rmsnorm(a.x, w.input_norm, eps_of(ctx), &a.rstd1);
  a.q = split_heads(ops::linear(a.n1, w.q_proj), c.num_attention_heads, d);
  a.k = split_heads(ops::linear(a.n1, w.k_proj), c.num_key_value_heads, d);
  a.v = split_heads(ops::linear(a.n1, w.v_proj), c.num_key_value_heads, d);
  a.q_rot = ops::rope(a.q, ctx.positions, theta_of(ctx));
  a.k_rot = ops::rope(a.k, ctx.positions, theta_of(ctx));
  a.attn = ctx.attention ? ctx.attention->forward(a.q_rot, a.k_rot, a.v, ctx.batch)
                         : ops::attention(a.q_rot, a.k_rot, a.v, ctx.batch);
  a.h = ops::add(a.x, ops::linear(merge_heads(a.attn.out), w.o_proj));

  a.n2 = ops::rmsnorm(a.h, w.post_attention_norm, eps_of(ctx), &a.rstd2);
  a.gate = ops::linear(a.n2, w.gate_proj);
  a.up = ops::linear(a.n2, w.up_proj);
  a.act = ops::swiglu(a.gate, a.up);
  return ops::add(a.h, ops::linear(a.act, w.down_proj));
}

// Drop what the policy does not keep. The projections before rotary (q, k) are never needed
// by the backward (it differentiates through rope with the positions alone).
void keep_only(BlockActivations& a, CheckpointPolicy policy) {
  a.q = a.k = Tensor();
  if (policy == CheckpointPolicy::none) return;
  if (policy == CheckpointPolicy::full) {
    Tensor x = a.x;
    a = BlockActivations();
    a.x = x;
    return;
  }
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
      return;
    case CheckpointPolicy::selective:
      a.n1 = ops::rmsnorm(a.x, w.input_norm, eps_of(ctx), &a.rstd1);
      a.n2 = ops::rmsnorm(a.h, w.post_attention_norm, eps_of(ctx), &a.rstd2);
      a.act = ops::swiglu(a.gate, a.up);
      return;
  }
}

Tensor block_backward(const Tensor& dy, const BlockActivations& a, const BlockWeights& w,
                      BlockWeights& g, const BlockContext& ctx) {
  // MLP: y = h + down(silu(gate) * up)
  Tensor d_act = ops::linear_backward(dy, a.act, w.down_proj, g.down_proj);
  ops::SwigluGrads d_mlp = ops::swiglu_backward(d_act, a.gate, a.up);
  Tensor d_n2 = ops::linear_backward(d_mlp.dg, a.n2, w.gate_proj, g.gate_proj);
  ops::add_inplace(d_n2, ops::linear_backward(d_mlp.du, a.n2, w.up_proj, g.up_proj));
  Tensor dh =
      ops::rmsnorm_backward(d_n2, a.h, w.post_attention_norm, a.rstd2, g.post_attention_norm);
  ops::add_inplace(dh, dy);

  // Attention: h = x + o(attention(rope(q), rope(k), v))
  Tensor d_attn = ops::linear_backward(dh, merge_heads(a.attn.out), w.o_proj, g.o_proj);
  const Tensor d_out = d_attn.view(a.attn.out.shape());
  ops::AttentionGrads d_qkv =
      ctx.attention ? ctx.attention->backward(d_out, a.q_rot, a.k_rot, a.v, a.attn, ctx.batch)
                    : ops::attention_backward(d_out, a.q_rot, a.k_rot, a.v, a.attn, ctx.batch);
  Tensor dq = ops::rope_backward(d_qkv.dq, ctx.positions, theta_of(ctx));
  Tensor dk = ops::rope_backward(d_qkv.dk, ctx.positions, theta_of(ctx));
  Tensor d_n1 = ops::linear_backward(merge_heads(dq), a.n1, w.q_proj, g.q_proj);
  ops::add_inplace(d_n1, ops::linear_backward(merge_heads(dk), a.n1, w.k_proj, g.k_proj));
  ops::add_inplace(d_n1, ops::linear_backward(merge_heads(d_qkv.dv), a.n1, w.v_proj, g.v_proj));
  Tensor dx = ops::rmsnorm_backward(d_n1, a.x, w.input_norm, a.rstd1, g.input_norm);
  ops::add_inplace(dx, dh);
  return dx;
}

}  // namespace frugal
