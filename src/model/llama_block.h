// One Llama transformer block, forward and backward, written out by hand:
//   h = x + o_proj(attention(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),  n1 = rmsnorm(x)
//   y = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),                      n2 = rmsnorm(h)
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "model/checkpoint_policy.h"
#include "model/fp8_scaling.h"
#include "model/llama_config.h"
#include "model/lora.h"
#include "model/parameter_provider.h"
#include "ops/ops.h"

namespace frugal {

// A block unit's tensors (weights or their gradients) by role, in UnitSpec order.
struct BlockWeights {
  Tensor input_norm, q_proj, k_proj, v_proj, o_proj, post_attention_norm, gate_proj, up_proj,
      down_proj;
  // LoRA adapters by BlockParam index (undefined where a projection has none).
  std::array<Tensor, kBlockParamCount> lora_a, lora_b;
  // Biases by BlockParam index: q, k and v's with LlamaConfig::qkv_bias, else none.
  std::array<Tensor, kBlockParamCount> bias;
  // Where projections left undefined (4-bit, ParameterProvider::gather_compressed) are made
  // when used: `unit` of `provider`.
  ParameterProvider* provider = nullptr;
  int64_t unit = -1;
  // As gradients: whether the backward adds into them or overwrites them (UnitGrads::write).
  GradWrite write = GradWrite::kAdd;

  // The base tensor of BlockParam p.
  Tensor& at(int p);
  const Tensor& at(int p) const { return const_cast<BlockWeights*>(this)->at(p); }
  // Projection p's weight, made from its 4-bit bytes if that is how it came: the caller holds
  // it only while it multiplies (one bf16 matrix at a time).
  Tensor projection(int p) const;
  // Projection p's E4M3 codes ([out, in], or [in, out] if transposed) where the provider has
  // them without a copy in the compute dtype: gathered as FP8 (ZeRO-3's FP8 weight gathers), or
  // 4-bit decoded straight to E4M3 with `slot`'s scale; else none (the caller casts projection(p)).
  std::optional<ops::Fp8Matrix> fp8_projection(int p, const ops::Fp8Slot& slot,
                                               bool transposed) const;
  // A unit's tensors: the 9 base ones, the q/k/v biases if the model has them, then the
  // adapters `lora` places (lora.h).
  static BlockWeights from_unit(const std::vector<Tensor>& unit, const LoraConfig* lora = nullptr);
  // A unit's gradients, with how they are written.
  static BlockWeights from_unit(const UnitGrads& grads, const LoraConfig* lora);
};

// The sequence-mixing step, when it is not ordinary attention over the local rows: ring
// attention across context-parallel ranks supplies both directions. The model does not know
// what is behind it; the trainer sets it. `window` is the config's sliding_window (0: none).
struct AttentionOperator {
  std::function<ops::Attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch,
                               int64_t window, const ops::DocumentBounds& documents)>
      forward;
  std::function<ops::AttentionGrads(const Tensor& dout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const ops::Attention& fwd, int64_t batch,
                                    int64_t window, const ops::DocumentBounds& documents)>
      backward;
};

// What the block needs from outside its weights.
struct BlockContext {
  const LlamaConfig* config = nullptr;
  int64_t batch = 1;  // sequences in the micro-batch; tokens = batch * seq
  Tensor positions;   // [tokens] i32, the rotary position of each token
  // Packed documents: attention stays inside each (undefined: one document per sequence).
  ops::DocumentBounds documents;
  const ops::RotaryFrequencies* rotary = nullptr;  // the rotary table of this forward
  CheckpointPolicy policy = CheckpointPolicy::none;
  const AttentionOperator* attention = nullptr;  // null: ops::attention on the local rows
  const LoraConfig* lora = nullptr;              // null: no adapters
  // Training noise (LoRA dropout) of this block in this micro-batch; 0: none (evaluation).
  uint64_t noise_seed = 0;
  // FP8 linears (training with [fp8] enabled; null: every product in the compute dtype), and
  // which block this is, for its scales.
  const Fp8Scaling* fp8 = nullptr;
  int64_t layer = 0;
  // Validation of the recompute (RecomputeCheck): the forward keeps a checksum of `act`, and
  // perturb_recompute changes the recomputed one (a testing aid).
  bool checksum_act = false;
  bool perturb_recompute = false;
  // Rows of the MLP computed at once (llama_mlp.h; 0, or at least the tokens: all of them).
  int64_t mlp_chunk_rows = 0;
  // The index of the first row this context's tensors hold in the micro-batch (a chunk of the
  // MLP: LoRA dropout draws the mask of those rows).
  int64_t first_row = 0;
};

// The forward's intermediates. Which ones survive until the backward is the policy's choice;
// recompute() restores the rest.
struct BlockActivations {
  Tensor x;             // input [T, H], always kept
  Tensor n1, rstd1;     // input norm
  Tensor q, k, v;       // projections, [T, heads, head_dim]
  Tensor q_rot, k_rot;  // after rotary
  ops::Attention attn;  // output [T, heads, head_dim] and log-sum-exp
  Tensor h;             // residual after attention
  Tensor n2, rstd2;     // post-attention norm
  Tensor gate, up;      // MLP projections [T, I]
  Tensor act;           // silu(gate) * up
  // (alpha / r) d(x) A^T of each adapted projection (LoRA; d: its dropout), [T, r]: kept by
  // every policy (they are small).
  std::array<Tensor, kBlockParamCount> lora_t;
  // With BlockContext::checksum_act: the original forward's checksum of act, kept by every
  // policy, and the recompute's (block_recompute's, or with the MLP in chunks
  // block_backward's, which makes act again chunk by chunk).
  double act_checksum = 0;
  double act_checksum_recomputed = 0;
};

// Runs the block on x, returns y; `saved` receives what the policy keeps.
Tensor block_forward(const Tensor& x, const BlockWeights& w, const BlockContext& ctx,
                     BlockActivations* saved);
// Fills in what the policy dropped.
void block_recompute(BlockActivations& a, const BlockWeights& w, const BlockContext& ctx);
// How block_backward adds into the block's gradients (ParameterProvider::grads): once each, by
// linear_backward and rmsnorm_backward, unless FP8 linears, LoRA adapters, q/k/v biases or the
// MLP in chunks bring other ops or several adds (`tokens`: the micro-batch's rows).
GradSums block_grad_sums(const BlockContext& ctx, int64_t tokens);
// Gradients: returns dx, accumulates weight gradients into `grads` (or overwrites them:
// grads.write). Needs recompute() first.
// With the MLP in chunks (llama_mlp.h) the MLP's intermediates the policy dropped are made
// here, a chunk at a time, and never exist whole.
Tensor block_backward(const Tensor& dy, BlockActivations& a, const BlockWeights& w,
                      BlockWeights& grads, const BlockContext& ctx);

}  // namespace frugal
