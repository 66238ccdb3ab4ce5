// Greedy and nucleus sampling.
#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/log.h"
#include "core/random.h"

namespace frugal {

int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     uint64_t& rng_state) {
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isfinite(logits[i]))
      fail("the model's logits for the next token hold ", logits[i], " (token id ", i,
           "): its weights overflow the forward pass, or are not finite");
  if (options.temperature <= 0)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  const double max_logit = *std::max_element(logits, logits + vocab);
  std::vector<double> p(vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i)
    sum += p[i] = std::exp((logits[i] - max_logit) / options.temperature);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  // Keep the smallest prefix whose mass reaches top_p, then draw from it.
  double kept = 0;
  int64_t n = 0;
  while (n < vocab && (n == 0 || kept < options.top_p * sum)) kept += p[order[n++]];
  double r = uniform01(rng_state) * kept;
  for (int64_t i = 0; i < n; ++i) {
    r -= p[order[i]];
    if (r <= 0) return order[i];
  }
  return order[n - 1];
}

std::vector<int32_t> generate(LlamaModel& model, ParameterProvider& params,
                              std::vector<int32_t> tokens, const SamplingOptions& options) {
  uint64_t rng_state = options.seed;
  const int64_t window = model.config().context_length();
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const int64_t start = std::max<int64_t>(0, int64_t(tokens.size()) - window);
    const int64_t seq = int64_t(tokens.size()) - start;
    const Batch b = next_token_batch(tokens.data() + start, seq);
    Tensor logits = model.forward_logits(b, params, 1);
    int32_t next = sample_token(logits.data<float>(), logits.size(1), options, rng_state);
    if (options.agree) next = options.agree(next);
    tokens.push_back(next);
    if (options.on_token) options.on_token(next);
    if (options.stops_at(next)) break;
  }
  return tokens;
}

int64_t new_tokens_within_context(const LlamaConfig& config, int64_t prompt_tokens, int64_t asked,
                                  const std::string& what) {
  const int64_t context = config.context_length();
  const std::string limit =
      "the model's context of " + std::to_string(context) +
      " tokens (max_position_embeddings = " + std::to_string(config.max_position_embeddings) +
      (config.rope_scaling.type == RopeScalingType::dynamic ? ", dynamic rope scaling" : "") + ")";
  if (prompt_tokens > context)
    fail(what, ": the prompt has ", prompt_tokens, " tokens, more than ", limit, "; shorten it");
  const int64_t room = context - prompt_tokens;
  if (asked <= room) return asked;
  log_warn(what, " ", asked, " with a prompt of ", prompt_tokens, " tokens passes ", limit,
           ": at most ", room, " new tokens");
  return room;
}

}  // namespace frugal
