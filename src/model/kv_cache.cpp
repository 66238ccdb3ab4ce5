// The cached forward, one block at a time, and generation on top of it.
#include "model/kv_cache.h"

#include <algorithm>

#include "model/llama_block.h"
#include "ops/attention_offset.h"
#include "ops/ops.h"

namespace frugal {

namespace {

// The head unit holds the final norm, then lm_head unless the embeddings are tied (see
// llama_units).
constexpr int kFinalNorm = 0;
constexpr int kLmHead = 1;

// One block on the new rows x [n, H]: the same math as llama_block.cpp's forward, with the
// new keys and values appended to the cache before attention.
Tensor block_forward_cached(const Tensor& x, const BlockWeights& w, const LlamaConfig& c,
                            const Tensor& positions, KvCache& cache, int64_t layer) {
  const int64_t n = x.size(0), d = c.attention_head_dim();
  const auto eps = static_cast<float>(c.rms_norm_eps);
  // The forward covers positions 0 .. past + n - 1 (dynamic scaling reads that length).
  const ops::RotaryFrequencies rotary = c.rotary(cache.length() + n);
  Tensor n1 = ops::rmsnorm(x, w.input_norm, eps, nullptr);
  // q, k, v with their biases when the model has them (Qwen2).
  auto project = [&](int p, int64_t heads) {
    Tensor y = ops::linear(n1, w.at(p));
    if (w.bias[p].defined()) ops::add_bias(y, w.bias[p]);
    return y.view({n, heads, d});
  };
  Tensor q = project(kQProj, c.num_attention_heads);
  Tensor k = project(kKProj, c.num_key_value_heads);
  Tensor v = project(kVProj, c.num_key_value_heads);
  Tensor q_rot = ops::rope(q, positions, rotary);
  Tensor k_rot = ops::rope(k, positions, rotary);
  const int64_t past = cache.length();
  auto [keys, values] = cache.append(layer, k_rot, v);
  // The whole cache stays; the sliding window hides what lies behind it.
  ops::Attention attn = ops::attention_block(q_rot, keys, values, 1, past, c.sliding_window);
  Tensor h = ops::linear(attn.out.view({n, c.num_attention_heads * d}), w.o_proj, /*residual=*/x);
  Tensor n2 = ops::rmsnorm(h, w.post_attention_norm, eps, nullptr);
  Tensor act = ops::swiglu(ops::linear(n2, w.gate_proj), ops::linear(n2, w.up_proj));
  return ops::linear(act, w.down_proj, /*residual=*/h);
}

}  // namespace

KvCache::KvCache(const LlamaConfig& config, int64_t capacity_tokens)
    : capacity_(capacity_tokens),
      shape_{capacity_tokens, config.num_key_value_heads, config.attention_head_dim()} {
  if (capacity_tokens <= 0) fail("KV cache capacity must be positive, got ", capacity_tokens);
  keys_.resize(static_cast<size_t>(config.num_hidden_layers));
  values_.resize(static_cast<size_t>(config.num_hidden_layers));
}

size_t KvCache::bytes() const {
  size_t total = 0;
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i].defined()) total += keys_[i].bytes() + values_[i].bytes();
  return total;
}

std::pair<Tensor, Tensor> KvCache::append(int64_t layer, const Tensor& k, const Tensor& v) {
  FRUGAL_CHECK(layer >= 0 && layer < layers(), "KV cache layer ", layer, " of ", layers());
  const int64_t n = k.size(0);
  if (length_ + n > capacity_)
    fail("KV cache full: ", length_, " cached + ", n, " new tokens exceed its capacity of ",
         capacity_);
  Tensor& keys = keys_[layer];
  Tensor& values = values_[layer];
  FRUGAL_CHECK(
      k.shape() == v.shape() && k.ndim() == 3 && k.size(1) == shape_[1] && k.size(2) == shape_[2],
      "KV cache append of k ", shape_string(k.shape()), " v ", shape_string(v.shape()),
      " to a cache of ", shape_string(shape_));
  if (!keys.defined()) {  // where the model runs, in its compute dtype
    keys = ops::empty_like(k, shape_, k.dtype());
    values = ops::empty_like(v, shape_, v.dtype());
  }
  Tensor key_rows = keys.rows(length_, length_ + n), value_rows = values.rows(length_, length_ + n);
  ops::copy(key_rows, k);
  ops::copy(value_rows, v);
  return {keys.rows(0, length_ + n), values.rows(0, length_ + n)};
}

void KvCache::advance(int64_t tokens) {
  FRUGAL_CHECK(tokens >= 0 && length_ + tokens <= capacity_, "KV cache advance by ", tokens,
               " at length ", length_, " of ", capacity_);
  length_ += tokens;
}

Tensor forward_cached(const LlamaConfig& config, ParameterProvider& params, KvCache& cache,
                      const std::vector<int32_t>& tokens, int64_t last_rows) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) fail("forward_cached: no tokens to run");
  if (cache.length() + n > cache.capacity())
    fail("KV cache full: ", cache.length(), " cached + ", n, " new tokens exceed its capacity of ",
         cache.capacity());
  if (cache.length() + n > config.context_length())
    fail("sequence of ", cache.length() + n, " tokens is longer than the model's context of ",
         config.context_length(), " tokens");
  Tensor ids = Tensor::empty({n}, DType::i32);
  std::copy(tokens.begin(), tokens.end(), ids.data<int32_t>());
  Tensor positions = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i)
    positions.data<int32_t>()[i] = static_cast<int32_t>(cache.length() + i);

  Tensor x;
  {
    const Tensor embedding = params.gather(embed_unit())[0];
    ids = ops::on_device_of(ids, embedding);
    positions = ops::on_device_of(positions, embedding);
    x = ops::embedding(ids, embedding);
  }
  params.release(embed_unit());
  const int64_t layers = config.num_hidden_layers;
  params.prefetch(block_unit(0));
  for (int64_t i = 0; i < layers; ++i) {
    params.prefetch(i + 1 < layers ? block_unit(i + 1) : head_unit(config));
    BlockWeights w = BlockWeights::from_unit(params.gather(block_unit(i)));
    x = block_forward_cached(x, w, config, positions, cache, i);
    params.release(block_unit(i));
  }
  cache.advance(n);

  const int64_t keep = last_rows > 0 ? std::min(last_rows, n) : n;
  const int64_t head = head_unit(config);
  std::vector<Tensor> head_w = params.gather(head);
  Tensor lm_head = config.tie_word_embeddings ? params.gather(embed_unit())[0] : head_w[kLmHead];
  Tensor logits = ops::linear(ops::rmsnorm(x.rows(n - keep, n), head_w[kFinalNorm],
                                           static_cast<float>(config.rms_norm_eps), nullptr),
                              lm_head);
  if (config.tie_word_embeddings) params.release(embed_unit());
  params.release(head);
  return ops::to_host_f32(logits);
}

std::vector<int32_t> generate_cached(const LlamaConfig& config, ParameterProvider& params,
                                     std::vector<int32_t> tokens, const SamplingOptions& options) {
  if (tokens.empty()) fail("generation needs at least one prompt token");
  if (options.max_new_tokens <= 0) return tokens;
  const int64_t window = config.context_length();
  const int64_t capacity =
      std::min<int64_t>(window, static_cast<int64_t>(tokens.size()) + options.max_new_tokens);
  KvCache cache(config, capacity);
  uint64_t rng_state = options.seed;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const auto size = static_cast<int64_t>(tokens.size());
    std::vector<int32_t> feed;
    if (size > window) {
      // Past the window, generate() re-runs the last `window` tokens at positions 0 ..
      // window - 1: every cached key moves, so the cache starts over.
      cache.clear();
      feed.assign(tokens.end() - window, tokens.end());
    } else {
      feed.assign(tokens.begin() + cache.length(), tokens.end());
    }
    Tensor logits = forward_cached(config, params, cache, feed, 1);
    int32_t next = sample_token(logits.data<float>(), logits.size(1), options, rng_state);
    if (options.agree) next = options.agree(next);
    tokens.push_back(next);
    if (options.on_token) options.on_token(next);
    if (options.stops_at(next)) break;
  }
  return tokens;
}

}  // namespace frugal
