// Text generation from a model: greedy, or temperature with nucleus (top-p) sampling.
// This version re-runs the whole prefix each token (no KV cache yet).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/llama_model.h"

namespace frugal {

struct SamplingOptions {
  int64_t max_new_tokens = 32;
  float temperature = 0;  // 0: greedy
  float top_p = 1.0f;
  uint64_t seed = 0;
  int32_t stop_token = -1;  // e.g. eos; -1: none
  // Ranks that generate together (weights sharded over them) take the token this returns, the
  // same on every rank (e.g. rank 0's), so that a rounding difference cannot make their
  // sequences, and so their collectives, part. Null: the sampled token.
  std::function<int32_t(int32_t)> agree;
  // Called with each token as it is chosen (the stop token too), before the next one is
  // computed: a command prints as the model writes. Null: nothing.
  std::function<void(int32_t)> on_token;
};

// Picks the next token from one row of logits.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     uint64_t& rng_state);

// The prompt followed by the generated tokens.
std::vector<int32_t> generate(LlamaModel& model, ParameterProvider& params,
                              std::vector<int32_t> tokens, const SamplingOptions& options);

}  // namespace frugal
