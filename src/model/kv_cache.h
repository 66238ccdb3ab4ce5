// Inference with a key/value cache: each layer keeps the rotated keys and the values of every
// token seen so far, so a new token costs one row through the model instead of the whole
// prefix. The forward here is the block forward of llama_block.cpp without the backward's
// bookkeeping, and attention of the new rows against all cached rows.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/llama_config.h"
#include "model/llama_model.h"
#include "model/parameter_provider.h"
#include "model/sampling.h"

namespace frugal {

// Keys (after rotary) and values of one sequence, per layer: [capacity, kv_heads, head_dim], on
// the device and in the dtype of the first keys appended (fp32 host memory on the CPU, bf16 on
// a GPU).
class KvCache {
 public:
  KvCache(const LlamaConfig& config, int64_t capacity_tokens);

  int64_t length() const { return length_; }  // tokens cached (positions 0 .. length-1)
  int64_t capacity() const { return capacity_; }
  int64_t layers() const { return static_cast<int64_t>(keys_.size()); }
  void clear() { length_ = 0; }
  size_t bytes() const;

  // Writes the new rows of `layer` at positions length() .. length() + k.size(0) - 1 and
  // returns views of that layer's keys and values over [0, length() + k.size(0)).
  // The length itself advances only with advance(), once every layer has appended.
  std::pair<Tensor, Tensor> append(int64_t layer, const Tensor& k, const Tensor& v);
  void advance(int64_t tokens);

 private:
  int64_t capacity_ = 0;
  int64_t length_ = 0;
  Shape shape_;  // of one layer's keys
  std::vector<Tensor> keys_, values_;
};

// Runs `tokens`, the next tokens of the cached sequence (positions cache.length() onwards),
// through the model on the weights' device; appends their keys and values to the cache and
// returns the logits of the last `last_rows` of them ([rows, vocab], f32 host memory; all of
// them when last_rows <= 0). Throws Error when the cache has no room for them.
Tensor forward_cached(const LlamaConfig& config, ParameterProvider& params, KvCache& cache,
                      const std::vector<int32_t>& tokens, int64_t last_rows = 1);

// The prompt followed by the generated tokens, like generate() in sampling.h and token for
// token the same (same sampling, same stop token, same window of max_position_embeddings:
// a sequence that outgrows the window is re-run from its last window tokens, as generate()
// does), but with a KV cache: each new token costs one row through the model.
std::vector<int32_t> generate_cached(const LlamaConfig& config, ParameterProvider& params,
                                     std::vector<int32_t> tokens, const SamplingOptions& options);

}  // namespace frugal
