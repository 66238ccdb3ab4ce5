// The whole Llama model: embedding, the blocks, final norm, head and loss. Weights come from a
// ParameterProvider one unit at a time, so the same code runs whole, sharded or quantized.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/checkpoint_policy.h"
#include "model/llama_config.h"
#include "model/loss_chunk.h"
#include "model/parameter_provider.h"

namespace frugal {

struct BlockActivations;
struct BlockWeights;
struct AttentionOperator;
struct LoraConfig;
struct BlockContext;
class Fp8Scaling;
class InputOffload;

// A micro-batch of `batch` sequences of `seq` tokens, flattened to [batch * seq].
struct Batch {
  Tensor tokens;     // i32 inputs
  Tensor targets;    // i32 next tokens; < 0 is masked out of the loss
  Tensor positions;  // i32 rotary positions (0..seq-1 in each sequence, or in each document)
  // Packed documents (data.packing = documents): each token's document's [start, end) in its
  // sequence; attention stays inside each. Undefined: every sequence is one document.
  ops::DocumentBounds documents;
  int64_t batch = 0;
  int64_t seq = 0;
  // Tokens of each whole sequence when these rows are a part of it (context parallelism:
  // dynamic rotary scaling depends on the whole length); 0: seq.
  int64_t full_seq = 0;
};

// Positions 0..seq-1 repeated for each sequence.
Tensor sequence_positions(int64_t batch, int64_t seq);
// One sequence as a batch for next-token prediction: targets are the ids shifted by one,
// the last position masked.
Batch next_token_batch(const int32_t* ids, int64_t n);
inline Batch next_token_batch(const std::vector<int32_t>& ids) {
  return next_token_batch(ids.data(), static_cast<int64_t>(ids.size()));
}
// Number of counted (unmasked) targets.
int64_t counted_targets(const Tensor& targets);

// What set_recompute_check compares: each block whose recomputed forward differs from the
// original (a non-deterministic kernel, or faulty hardware), by layer, with both checksums
// (ops::sum_squares of the product: deterministic kernels give equal sums for equal tensors).
struct RecomputeCheck {
  struct Mismatch {
    int64_t layer;
    double forward, recomputed;
  };
  std::vector<Mismatch> mismatches;
  int64_t blocks_checked = 0;
  // A testing aid (FRUGAL_INJECT_FAULT=recompute): the recompute of this layer is perturbed as
  // a non-deterministic kernel would make it; -1: none.
  int64_t perturb_layer = -1;
};

class LlamaModel {
 public:
  explicit LlamaModel(const LlamaConfig& config) : config_(config) { config_.validate(); }
  const LlamaConfig& config() const { return config_; }

  // Forward and backward of one micro-batch: returns the SUM of the token losses and adds
  // grad_scale * d(sum)/d(weights) into the provider's gradients.
  double forward_backward(const Batch& batch, ParameterProvider& params, float grad_scale,
                          CheckpointPolicy policy);
  // Forward only: the sum of the token losses.
  double forward_loss(const Batch& batch, ParameterProvider& params);
  // Forward only: the sums of the token losses of consecutive ranges of rows, range i being
  // rows [row_ends[i-1], row_ends[i]) (from 0; the last end is every row). With one sequence
  // a row is a position: the loss by position bucket.
  std::vector<double> forward_loss_sums(const Batch& batch, ParameterProvider& params,
                                        const std::vector<int64_t>& row_ends);
  // Forward only: logits [rows, vocab] (f32, host memory) of the last `last_rows` positions of
  // each sequence (all of them when last_rows <= 0).
  Tensor forward_logits(const Batch& batch, ParameterProvider& params, int64_t last_rows = 0);

  // Rows of logits that the loss computes at once, bounding the [rows, vocab] buffer
  // (train.loss_chunk_tokens, loss_chunk.h).
  void set_loss_chunk_rows(int64_t rows) { loss_chunk_rows_ = rows; }
  // The attention every block uses (ring attention across context-parallel ranks); null,
  // the default, is ordinary causal attention over each sequence's local rows. Not owned.
  void set_attention(const AttentionOperator* attention) { attention_ = attention; }
  // LoRA adapters in the block units (lora.h); null, the default, means none. Not owned.
  void set_lora(const LoraConfig* lora) { lora_ = lora; }
  // FP8 block linears while training (null: off); the scaling state outlives the model's use.
  void set_fp8(const Fp8Scaling* fp8) { fp8_ = fp8; }
  // The seed of the training noise (LoRA dropout) of the next forward_backward calls; 0, the
  // default, means none. train_step sets one per micro-batch; evaluation never has noise.
  void set_noise(uint64_t seed) { noise_ = seed; }
  const LoraConfig* lora() const { return lora_; }
  // Validation of activation checkpointing for the next forward_backward calls (null, the
  // default: none): each block's recomputed SwiGLU product, which under `full` depends on the
  // whole recomputed block, is checksummed and compared with the original forward's. Not owned.
  void set_recompute_check(RecomputeCheck* check) { recompute_check_ = check; }
  // Rows of each block's MLP computed at once (train.mlp_chunk_tokens, llama_mlp.h): 0, the
  // default, chooses from the micro-batch's tokens (whole up to 16,384); at least the tokens:
  // whole.
  void set_mlp_chunk_tokens(int64_t tokens) { mlp_chunk_tokens_ = tokens; }
  // Activation offload (train.activation_offload = inputs): forward_backward keeps the blocks'
  // inputs in this arena (pinned host memory on a GPU) between the forward and the backward
  // (activation_offload.h); null, the default: on the device. Not owned.
  void set_input_offload(Arena* host) { input_offload_ = host; }

 private:
  // ctx for block `layer`, with its own noise seed when training.
  BlockContext layer_context(const BlockContext& ctx, int64_t layer, bool training) const;
  // Looks up the embeddings; moves the batch's ids and positions to the weights' device first
  // (once per call on a GPU).
  Tensor embed(Batch& batch, ParameterProvider& params);
  Tensor blocks_forward(Tensor x, const Batch& batch, ParameterProvider& params,
                        CheckpointPolicy policy, std::vector<BlockActivations>* saved,
                        bool checksum_act = false, InputOffload* offload = nullptr);
  // Final norm, head and loss forward and backward; returns d(loss)/d(x).
  Tensor head_forward_backward(const Tensor& x, const Batch& batch, ParameterProvider& params,
                               float grad_scale, Tensor* loss_sum);
  Tensor head_weight(const std::vector<Tensor>& head_unit, ParameterProvider& params);
  // A block's weights, 4-bit projections left to be made one at a time when used.
  BlockWeights block_weights(ParameterProvider& params, int64_t unit) const;

  LlamaConfig config_;
  int64_t loss_chunk_rows_ = kDefaultLossChunkTokens;
  const AttentionOperator* attention_ = nullptr;
  const LoraConfig* lora_ = nullptr;
  const Fp8Scaling* fp8_ = nullptr;
  uint64_t noise_ = 0;
  RecomputeCheck* recompute_check_ = nullptr;
  int64_t mlp_chunk_tokens_ = 0;
  Arena* input_offload_ = nullptr;
};

}  // namespace frugal
