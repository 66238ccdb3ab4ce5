// The transformer block as a page of math; see llama_block.h for the equations.
#include "model/llama_block.h"

#include "model/block_projection.h"
#include "model/llama_mlp.h"

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

BlockWeights BlockWeights::from_unit(const UnitGrads& grads, const LoraConfig* lora) {
  BlockWeights g = from_unit(grads.tensors, lora);
  g.write = grads.write;
  return g;
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

std::optional<ops::Fp8Matrix> BlockWeights::fp8_projection(int p, const ops::Fp8Slot& slot,
                                                           bool transposed) const {
  if (at(p).defined() || !provider) return std::nullopt;
  return provider->fp8_weight(unit, static_cast<size_t>(p), slot, transposed);
}

namespace {

// [T, heads * head_dim] <-> [T, heads, head_dim]
Tensor split_heads(const Tensor& t, int64_t heads, int64_t head_dim) {
  return t.view({t.size(0), heads, head_dim});
}
Tensor merge_heads(const Tensor& t) { return t.view({t.size(0), t.size(1) * t.size(2)}); }

float eps_of(const BlockContext& ctx) { return static_cast<float>(ctx.config->rms_norm_eps); }

const ops::RotaryFrequencies& rotary_of(const BlockContext& ctx) {
  FRUGAL_CHECK(ctx.rotary != nullptr, "block context without a rotary table");
  return *ctx.rotary;
}

// What the forward keeps of the MLP when it runs in chunks (llama_mlp.h).
MlpKept mlp_kept(CheckpointPolicy policy) {
  switch (policy) {
    case CheckpointPolicy::none:
      return MlpKept::everything;
    case CheckpointPolicy::selective:
      return MlpKept::projections;
    case CheckpointPolicy::full:
      break;
  }
  return MlpKept::nothing;
}

// The attention half: n1 .. h filled in.
void attention_forward(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx,
                       Fp8InputCasts& casts) {
  const LlamaConfig& c = *ctx.config;
  const int64_t d = c.attention_head_dim();
  a.n1 = ops::rmsnorm(a.x, w.input_norm, eps_of(ctx), &a.rstd1);
  a.q = split_heads(project(a.n1, w, kQProj, ctx, a, casts), c.num_attention_heads, d);
  a.k = split_heads(project(a.n1, w, kKProj, ctx, a, casts), c.num_key_value_heads, d);
  a.v = split_heads(project(a.n1, w, kVProj, ctx, a, casts), c.num_key_value_heads, d);
  a.q_rot = ops::rope(a.q, ctx.positions, rotary_of(ctx));
  a.k_rot = ops::rope(a.k, ctx.positions, rotary_of(ctx));
  const int64_t window = c.sliding_window;
  a.attn = ctx.attention
               ? ctx.attention->forward(a.q_rot, a.k_rot, a.v, ctx.batch, window, ctx.documents)
               : ops::attention(a.q_rot, a.k_rot, a.v, ctx.batch, window, ctx.documents);
  a.h = project(merge_heads(a.attn.out), w, kOProj, ctx, a, casts, /*residual=*/a.x);
}

// Everything the forward computes: every intermediate filled in, or with the MLP in chunks,
// the MLP's that `kept` names. FP8: n1 cast once for q, k, v; n2 once for gate, up.
Tensor forward_all(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx,
                   MlpKept kept, double* checksum) {
  Fp8InputCasts casts;
  attention_forward(a, w, ctx, casts);
  return mlp_forward(a, w, ctx, casts, kept, checksum);
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
  const MlpKept kept = saved ? mlp_kept(ctx.policy) : MlpKept::nothing;
  Tensor y = forward_all(a, w, ctx, kept, saved && ctx.checksum_act ? &a.act_checksum : nullptr);
  if (saved) {
    keep_only(a, ctx.policy);
    *saved = std::move(a);
  }
  return y;
}

void block_recompute(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx) {
  // With the MLP in chunks its intermediates are made again chunk by chunk in the backward.
  const bool chunks = mlp_in_chunks(ctx, a.x.size(0));
  switch (ctx.policy) {
    case CheckpointPolicy::none:
      return;
    case CheckpointPolicy::full:
      if (chunks) {
        Fp8InputCasts casts;
        attention_forward(a, w, ctx, casts);
        return;
      }
      forward_all(a, w, ctx, MlpKept::everything, nullptr);
      break;
    case CheckpointPolicy::selective:
      a.n1 = ops::rmsnorm(a.x, w.input_norm, eps_of(ctx), &a.rstd1);
      if (chunks) return;
      a.n2 = ops::rmsnorm(a.h, w.post_attention_norm, eps_of(ctx), &a.rstd2);
      a.act = ops::swiglu(a.gate, a.up);
      break;
  }
  // As a kernel that is not deterministic would: the recompute differs from the forward.
  if (ctx.perturb_recompute) ops::scale_inplace(a.act, 1.0f + 1.0f / 64);
  if (ctx.checksum_act) a.act_checksum_recomputed = ops::sum_squares({a.act});
}

GradSums block_grad_sums(const BlockContext& ctx, int64_t tokens) {
  const bool once = !ctx.fp8 && !ctx.lora && !ctx.config->qkv_bias() && !mlp_in_chunks(ctx, tokens);
  return once ? GradSums::kOnce : GradSums::kSeveral;
}

Tensor block_backward(const Tensor& dy, BlockActivations& a, const BlockWeights& w, BlockWeights& g,
                      const BlockContext& ctx) {
  Fp8InputCasts casts;  // FP8: the transposed casts of n1 and n2, each made once
  // MLP: y = h + down(silu(gate) * up); in chunks, its recompute's checksum comes from here.
  const bool chunk_check =
      ctx.checksum_act && ctx.policy != CheckpointPolicy::none && mlp_in_chunks(ctx, a.x.size(0));
  Tensor dh =
      mlp_backward(dy, a, w, g, ctx, casts, chunk_check ? &a.act_checksum_recomputed : nullptr);

  // Attention: h = x + o(attention(rope(q), rope(k), v))
  Tensor d_attn = project_backward(dh, merge_heads(a.attn.out), w, g, kOProj, ctx, a, casts);
  const Tensor d_out = d_attn.view(a.attn.out.shape());
  const int64_t window = ctx.config->sliding_window;
  ops::AttentionGrads d_qkv = ctx.attention
                                  ? ctx.attention->backward(d_out, a.q_rot, a.k_rot, a.v, a.attn,
                                                            ctx.batch, window, ctx.documents)
                                  : ops::attention_backward(d_out, a.q_rot, a.k_rot, a.v, a.attn,
                                                            ctx.batch, window, ctx.documents);
  Tensor dq = ops::rope_backward(d_qkv.dq, ctx.positions, rotary_of(ctx));
  Tensor dk = ops::rope_backward(d_qkv.dk, ctx.positions, rotary_of(ctx));
  Tensor d_n1 = project_backward(merge_heads(dq), a.n1, w, g, kQProj, ctx, a, casts);
  project_backward(merge_heads(dk), a.n1, w, g, kKProj, ctx, a, casts, &d_n1);
  project_backward(merge_heads(d_qkv.dv), a.n1, w, g, kVProj, ctx, a, casts, &d_n1);
  return ops::rmsnorm_backward(d_n1, a.x, w.input_norm, a.rstd1, g.input_norm, /*dresidual=*/dh,
                               g.write);
}

}  // namespace frugal
