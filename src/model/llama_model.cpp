// The model's forward and backward over its units; see llama_block.cpp for one block.
#include "model/llama_model.h"

#include <algorithm>
#include <optional>

#include "core/random.h"
#include "model/activation_offload.h"
#include "model/llama_block.h"
#include "model/llama_mlp.h"
#include "ops/ops.h"

namespace frugal {

Tensor sequence_positions(int64_t batch, int64_t seq) {
  Tensor positions = Tensor::empty({batch * seq}, DType::i32);
  int32_t* p = positions.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) p[b * seq + s] = static_cast<int32_t>(s);
  return positions;
}

Batch next_token_batch(const int32_t* ids, int64_t n) {
  Batch b;
  b.batch = 1;
  b.seq = n;
  b.tokens = Tensor::empty({n}, DType::i32);
  b.targets = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) {
    b.tokens.data<int32_t>()[i] = ids[i];
    b.targets.data<int32_t>()[i] = i + 1 < n ? ids[i + 1] : -1;
  }
  b.positions = sequence_positions(1, n);
  return b;
}

int64_t counted_targets(const Tensor& targets) {
  const int32_t* t = targets.data<int32_t>();
  return std::count_if(t, t + targets.numel(), [](int32_t v) { return v >= 0; });
}

namespace {

// Index of the final norm and the head matrix inside the head unit.
constexpr int kFinalNorm = 0;
constexpr int kLmHead = 1;

// The rotary table of the batch: dynamic scaling depends on the whole sequence's length.
ops::RotaryFrequencies batch_rotary(const LlamaConfig& config, const Batch& batch) {
  return config.rotary(batch.full_seq > 0 ? batch.full_seq : batch.seq);
}

BlockContext block_context(const LlamaConfig& config, const Batch& batch, CheckpointPolicy policy,
                           const AttentionOperator* attention, const LoraConfig* lora,
                           const ops::RotaryFrequencies& rotary, int64_t mlp_chunk_tokens) {
  BlockContext ctx;
  ctx.mlp_chunk_rows = mlp_chunk_rows(batch.batch * batch.seq, config, mlp_chunk_tokens);
  ctx.rotary = &rotary;
  ctx.lora = lora;
  ctx.attention = attention;
  ctx.config = &config;
  ctx.batch = batch.batch;
  ctx.positions = batch.positions;
  ctx.documents = batch.documents;
  ctx.policy = policy;
  return ctx;
}

}  // namespace

BlockContext LlamaModel::layer_context(const BlockContext& ctx, int64_t layer,
                                       bool training) const {
  BlockContext c = ctx;
  c.layer = layer;
  // FP8 while training only: evaluation and generation run in the compute dtype, and leave
  // the scales' history alone.
  if (training) c.fp8 = fp8_;
  if (training && noise_ != 0) {
    uint64_t state = noise_ * 0x9E3779B97F4A7C15ull + uint64_t(layer);
    c.noise_seed = splitmix64(state) | 1;  // never 0 (which means none)
  }
  return c;
}

Tensor LlamaModel::embed(Batch& batch, ParameterProvider& params) {
  std::vector<Tensor> unit = params.gather(embed_unit());
  batch.tokens = ops::on_device_of(batch.tokens, unit[0]);
  batch.targets = ops::on_device_of(batch.targets, unit[0]);
  batch.positions = ops::on_device_of(batch.positions, unit[0]);
  if (batch.documents.defined()) {
    batch.documents.start = ops::on_device_of(batch.documents.start, unit[0]);
    batch.documents.end = ops::on_device_of(batch.documents.end, unit[0]);
  }
  Tensor x = ops::embedding(batch.tokens, unit[0]);
  params.release(embed_unit());
  return x;
}

Tensor LlamaModel::head_weight(const std::vector<Tensor>& head_unit, ParameterProvider& params) {
  return config_.tie_word_embeddings ? params.gather(embed_unit())[0] : head_unit[kLmHead];
}

BlockWeights LlamaModel::block_weights(ParameterProvider& params, int64_t unit) const {
  BlockWeights w = BlockWeights::from_unit(params.gather_compressed(unit), lora_);
  w.provider = &params;
  w.unit = unit;
  return w;
}

Tensor LlamaModel::blocks_forward(Tensor x, const Batch& batch, ParameterProvider& params,
                                  CheckpointPolicy policy, std::vector<BlockActivations>* saved,
                                  bool checksum_act, InputOffload* offload) {
  const ops::RotaryFrequencies rotary = batch_rotary(config_, batch);
  BlockContext ctx =
      block_context(config_, batch, policy, attention_, lora_, rotary, mlp_chunk_tokens_);
  ctx.checksum_act = checksum_act;
  const int64_t layers = config_.num_hidden_layers;
  params.prefetch(block_unit(0));
  for (int64_t i = 0; i < layers; ++i) {
    params.prefetch(i + 1 < layers ? block_unit(i + 1) : head_unit(config_));
    BlockWeights w = block_weights(params, block_unit(i));
    // The input goes down beside this block's forward, which reads it on the device.
    const bool offloaded = offload && offload->offloads(i);
    if (offloaded) offload->store(i, x);
    x = block_forward(x, w, layer_context(ctx, i, saved != nullptr),
                      saved ? &(*saved)[i] : nullptr);
    if (offloaded) (*saved)[i].x = Tensor();
    params.release(block_unit(i));
  }
  if (offload) offload->finish_forward();
  return x;
}

Tensor LlamaModel::head_forward_backward(const Tensor& x, const Batch& batch,
                                         ParameterProvider& params, float grad_scale,
                                         Tensor* loss_sum) {
  // Head and loss, forward and backward together, a chunk of rows at a time, so the
  // [tokens, vocab] logits never exist whole. The head's weights and whole gradients live
  // only inside this function.
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const int64_t head = head_unit(config_);
  std::vector<Tensor> head_w = params.gather(head);
  std::vector<Tensor> head_g = params.grads(head, GradSums::kSeveral).tensors;
  Tensor lm_head = head_weight(head_w, params);
  Tensor lm_head_grad = config_.tie_word_embeddings
                            ? params.grads(embed_unit(), GradSums::kSeveral).tensors[0]
                            : head_g[kLmHead];
  Tensor rstd;
  Tensor xn = ops::rmsnorm(x, head_w[kFinalNorm], eps, &rstd);
  Tensor d_xn = ops::empty_like(xn, xn.shape(), xn.dtype());
  Tensor& loss = *loss_sum = ops::loss_accumulator(xn);
  const int64_t rows = xn.size(0);
  for (int64_t begin = 0; begin < rows; begin += loss_chunk_rows_) {
    const int64_t end = std::min(rows, begin + loss_chunk_rows_);
    Tensor xn_rows = xn.rows(begin, end);
    Tensor logits = ops::linear(xn_rows, lm_head);
    Tensor d_logits;
    ops::cross_entropy(logits, batch.targets.rows(begin, end), grad_scale, &d_logits, loss);
    Tensor d_xn_rows = d_xn.rows(begin, end);
    ops::copy(d_xn_rows, ops::linear_backward(d_logits, xn_rows, lm_head, lm_head_grad));
  }
  Tensor dx = ops::rmsnorm_backward(d_xn, x, head_w[kFinalNorm], rstd, head_g[kFinalNorm]);
  head_w.clear();
  head_g.clear();
  lm_head = lm_head_grad = Tensor();
  params.grads_done(head);
  if (config_.tie_word_embeddings) {
    params.grads_done(embed_unit());
    params.release(embed_unit());
  }
  params.release(head);
  return dx;
}

double LlamaModel::forward_backward(const Batch& host_batch, ParameterProvider& params,
                                    float grad_scale, CheckpointPolicy policy) {
  const int64_t layers = config_.num_hidden_layers;
  std::vector<BlockActivations> saved(layers);
  Batch batch = host_batch;
  // Only a policy that recomputes has something to validate.
  const bool checking = recompute_check_ && policy != CheckpointPolicy::none;
  Tensor embedded = embed(batch, params);
  std::optional<InputOffload> offload;
  if (input_offload_) offload.emplace(*input_offload_, layers);
  Tensor x = blocks_forward(embedded, batch, params, policy, &saved, checking,
                            offload ? &*offload : nullptr);

  // The loss is read after the backward is queued, so the GPU never waits for the host.
  Tensor loss_sum;
  Tensor dx = head_forward_backward(x, batch, params, grad_scale, &loss_sum);

  // Blocks in reverse: gather, recompute what the policy dropped, backward, hand back grads.
  const ops::RotaryFrequencies rotary = batch_rotary(config_, batch);
  BlockContext ctx =
      block_context(config_, batch, policy, attention_, lora_, rotary, mlp_chunk_tokens_);
  ctx.checksum_act = checking;
  for (int64_t i = layers - 1; i >= 0; --i) {
    if (i > 0) params.prefetch(block_unit(i - 1));
    // The input of the next block down comes back from host memory while this one computes.
    if (offload && offload->offloads(i)) saved[i].x = offload->take(i, dx);
    if (offload && i > 0 && offload->offloads(i - 1)) offload->fetch(i - 1, dx);
    BlockWeights w = block_weights(params, block_unit(i));
    BlockContext layer_ctx = layer_context(ctx, i, true);
    if (checking) layer_ctx.perturb_recompute = recompute_check_->perturb_layer == i;
    // The layer's context: FP8 linears, which add only into fp32, are set there.
    BlockWeights g = BlockWeights::from_unit(
        params.grads(block_unit(i), block_grad_sums(layer_ctx, saved[i].x.size(0))), lora_);
    block_recompute(saved[i], w, layer_ctx);
    dx = block_backward(dx, saved[i], w, g, layer_ctx);
    if (checking) {
      ++recompute_check_->blocks_checked;
      if (saved[i].act_checksum_recomputed != saved[i].act_checksum)
        recompute_check_->mismatches.push_back(
            {i, saved[i].act_checksum, saved[i].act_checksum_recomputed});
    }
    saved[i] = BlockActivations{};
    w = g = BlockWeights{};  // drop our references before the provider frees the unit
    params.grads_done(block_unit(i));
    params.release(block_unit(i));
  }

  {
    std::vector<Tensor> embed_g = params.grads(embed_unit(), GradSums::kSeveral).tensors;
    if (embed_g[0].defined()) ops::embedding_backward(embed_g[0], dx, batch.tokens);  // not frozen
  }
  params.grads_done(embed_unit());
  params.finish_backward();
  return ops::read_loss(loss_sum);
}

double LlamaModel::forward_loss(const Batch& batch, ParameterProvider& params) {
  return forward_loss_sums(batch, params, {batch.batch * batch.seq})[0];
}

std::vector<double> LlamaModel::forward_loss_sums(const Batch& host_batch,
                                                  ParameterProvider& params,
                                                  const std::vector<int64_t>& row_ends) {
  const int64_t rows = host_batch.batch * host_batch.seq;
  FRUGAL_CHECK(!row_ends.empty() && row_ends.back() == rows &&
                   std::is_sorted(row_ends.begin(), row_ends.end()) && row_ends.front() >= 0,
               "forward_loss_sums: row ends must rise to the ", rows, " rows");
  Batch batch = host_batch;
  Tensor embedded = embed(batch, params);
  Tensor x = blocks_forward(embedded, batch, params, CheckpointPolicy::none, nullptr);
  const int64_t head = head_unit(config_);
  std::vector<Tensor> head_w = params.gather(head);
  Tensor lm_head = head_weight(head_w, params);
  Tensor xn =
      ops::rmsnorm(x, head_w[kFinalNorm], static_cast<float>(config_.rms_norm_eps), nullptr);
  // One accumulator per range of rows; a chunk never crosses a range's end.
  std::vector<Tensor> sums;
  int64_t range_begin = 0;
  for (const int64_t range_end : row_ends) {
    Tensor loss = ops::loss_accumulator(xn);
    for (int64_t begin = range_begin; begin < range_end; begin += loss_chunk_rows_) {
      const int64_t end = std::min(range_end, begin + loss_chunk_rows_);
      Tensor logits = ops::linear(xn.rows(begin, end), lm_head);
      ops::cross_entropy(logits, batch.targets.rows(begin, end), 0.0f, nullptr, loss);
    }
    sums.push_back(loss);
    range_begin = range_end;
  }
  std::vector<double> loss_sums;
  for (const Tensor& loss : sums) loss_sums.push_back(ops::read_loss(loss));
  if (config_.tie_word_embeddings) params.release(embed_unit());
  params.release(head);
  return loss_sums;
}

Tensor LlamaModel::forward_logits(const Batch& host_batch, ParameterProvider& params,
                                  int64_t last_rows) {
  Batch batch = host_batch;
  Tensor embedded = embed(batch, params);
  Tensor x = blocks_forward(embedded, batch, params, CheckpointPolicy::none, nullptr);
  const int64_t keep = last_rows > 0 ? std::min(last_rows, batch.seq) : batch.seq;
  const int64_t hidden = config_.hidden_size;
  Tensor picked = ops::empty_like(x, {batch.batch * keep, hidden}, x.dtype());
  for (int64_t b = 0; b < batch.batch; ++b) {
    Tensor rows = picked.rows(b * keep, (b + 1) * keep);
    ops::copy(rows, x.rows(b * batch.seq + batch.seq - keep, (b + 1) * batch.seq));
  }
  const int64_t head = head_unit(config_);
  std::vector<Tensor> head_w = params.gather(head);
  Tensor lm_head = head_weight(head_w, params);
  Tensor logits = ops::linear(
      ops::rmsnorm(picked, head_w[kFinalNorm], static_cast<float>(config_.rms_norm_eps), nullptr),
      lm_head);
  if (config_.tie_word_embeddings) params.release(embed_unit());
  params.release(head);
  return ops::to_host_f32(logits);
}

}  // namespace frugal
