// Text generation from a model: greedy, or temperature with nucleus (top-p) sampling.
// This version re-runs the whole prefix each token (no KV cache yet).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/llama_model.h"

namespace frugal {

struct SamplingOptions {
  int64_t max_new_tokens = 32;
  float temperature = 0;  // 0: greedy
  float top_p = 1.0f;
  uint64_t seed = 0;
  // Tokens that end the sequence once chosen (kept in it): eos, a chat model's end-of-turn ids.
  std::vector<int32_t> stop_tokens;
  bool stops_at(int32_t token) const {
    return std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end();
  }
  // Ranks that generate together (weights sharded over them) take the token this returns, the
  // same on every rank (e.g. rank 0's), so that a rounding difference cannot make their
  // sequences, and so their collectives, part. Null: the sampled token.
  std::function<int32_t(int32_t)> agree;
  // Called with each token as it is chosen (the stop token too), before the next one is
  // computed: a command prints as the model writes. Null: nothing.
  std::function<void(int32_t)> on_token;
};

// Picks the next token from one row of logits. Throws Error when a logit is not finite (as
// eval refuses a model whose loss is not): the weights overflow the forward pass or are not
// finite, and any token drawn from such a row would be noise.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     uint64_t& rng_state);

// The new tokens a generation may add to a prompt of `prompt_tokens` tokens: `asked`, or as
// many as fill the model's context (config.context_length(): max_position_embeddings, times
// the factor of dynamic rope scaling), where prompt and continuation stop, with a warning
// that names `what` (e.g. "generate: --max-new-tokens") and the number asked. Positions past
// the context were never trained, and a window slid along would drop the prompt unsaid.
// Throws Error starting with `what` when the prompt alone is longer than the context.
int64_t new_tokens_within_context(const LlamaConfig& config, int64_t prompt_tokens, int64_t asked,
                                  const std::string& what);

// The prompt followed by the generated tokens.
std::vector<int32_t> generate(LlamaModel& model, ParameterProvider& params,
                              std::vector<int32_t> tokens, const SamplingOptions& options);

}  // namespace frugal
