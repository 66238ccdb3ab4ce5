// The whole model's gradient against central finite differences of its loss, on awkward
// sizes (hidden 48, 3 heads over 1 kv head, seq 13), for every checkpoint policy and with
// tied embeddings, and with Qwen2's q/k/v biases; and the policies against each other.
#include <cmath>
#include <random>

#include "catch_compat.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model_support.h"

using namespace frugal;

namespace {

LlamaConfig awkward_config(bool tied, Architecture architecture = Architecture::llama) {
  LlamaConfig c;
  c.architecture = architecture;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.vocab_size = 37;
  c.max_position_embeddings = 64;
  c.rope_theta = 500.0;  // not the default, so a wrong theta shows
  c.tie_word_embeddings = tied;
  return c;
}

Batch random_batch(int64_t batch, int64_t seq, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  b.batch = batch;
  b.seq = seq;
  b.tokens = Tensor::empty({batch * seq}, DType::i32);
  b.targets = Tensor::empty({batch * seq}, DType::i32);
  for (int64_t i = 0; i < batch * seq; ++i) {
    b.tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
    // every fifth target masked, as padding would be
    b.targets.data<int32_t>()[i] = i % 5 == 3 ? -100 : static_cast<int32_t>(rng() % vocab);
  }
  b.positions = sequence_positions(batch, seq);
  return b;
}

// Mean loss over counted targets, in the model's own fp32 forward.
double mean_loss(LlamaModel& model, LocalParameters& params, const Batch& b) {
  return model.forward_loss(b, params) / static_cast<double>(counted_targets(b.targets));
}

void check_gradients(bool tied, CheckpointPolicy policy,
                     Architecture architecture = Architecture::llama, uint64_t seed = 7) {
  LlamaConfig config = awkward_config(tied, architecture);
  LlamaModel model(config);
  // A larger init than training uses (0.02), so that every gradient is well above fp32
  // noise, yet small enough that the loss is smooth on the finite-difference scale.
  LocalParameters params(config, seed, 0.1f, true);
  Batch b = random_batch(2, 13, config.vocab_size, 11);
  const float scale = 1.0f / static_cast<float>(counted_targets(b.targets));
  params.zero_grads();
  model.forward_backward(b, params, scale, policy);

  // Directional derivative along a random direction, one parameter tensor at a time:
  // (L(p + h u) - L(p - h u)) / 2h  ~  <grad, u>.
  std::mt19937 rng(3);
  for (TrainableShard& s : params.trainable()) {
    const test::DirectionalDerivative d = test::directional_derivative(
        s.param, s.grad, rng, [&] { return mean_loss(model, params, b); });
    const double analytic = d.analytic, numeric = d.numeric;
    INFO(s.name << ": analytic " << analytic << " numeric " << numeric);
    CHECK(std::abs(analytic - numeric) <= 2e-3 * std::abs(numeric) + 5e-5);
  }
}

}  // namespace

TEST_CASE("model gradient equals finite differences", "[model]") {
  SECTION("untied, no checkpointing") { check_gradients(false, CheckpointPolicy::none); }
  SECTION("tied embeddings, selective") { check_gradients(true, CheckpointPolicy::selective); }
  SECTION("untied, full recompute") { check_gradients(false, CheckpointPolicy::full); }
  SECTION("Qwen2's q/k/v biases, selective") {
    // (Seed 7 draws a direction nearly orthogonal to one layer's v_proj gradient, whose
    // directional derivative then drowns in the finite differences' rounding.)
    check_gradients(false, CheckpointPolicy::selective, Architecture::qwen2, 9);
  }
}

TEST_CASE("checkpoint policies give identical gradients", "[model]") {
  LlamaConfig config = awkward_config(false);
  LlamaModel model(config);
  Batch b = random_batch(2, 13, config.vocab_size, 5);
  const float scale = 1.0f / static_cast<float>(counted_targets(b.targets));
  LocalParameters reference(config, 9, 0.1f, true);
  const double loss_none = model.forward_backward(b, reference, scale, CheckpointPolicy::none);
  for (CheckpointPolicy policy : {CheckpointPolicy::selective, CheckpointPolicy::full}) {
    LocalParameters params(config, 9, 0.1f, true);
    const double loss = model.forward_backward(b, params, scale, policy);
    CHECK(loss == loss_none);
    std::vector<TrainableShard> a = reference.trainable(), c = params.trainable();
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].name << " under " << checkpoint_policy_name(policy));
      bool equal = true;
      for (int64_t j = 0; j < a[i].grad.numel(); ++j)
        equal = equal && a[i].grad.data<float>()[j] == c[i].grad.data<float>()[j];
      CHECK(equal);
    }
  }
}

TEST_CASE("loss of a fresh model is near log(vocab)", "[model]") {
  // With tiny weights the logits are almost uniform: an independent, published constant.
  LlamaConfig config = awkward_config(false);
  LlamaModel model(config);
  LocalParameters params(config, 1, 1e-4f, false);
  Batch b = random_batch(3, 13, config.vocab_size, 2);
  CHECK(mean_loss(model, params, b) == Approx(std::log(37.0)).epsilon(1e-4));
}

TEST_CASE("initialisation is independent of how rows are split", "[model]") {
  Tensor whole = Tensor::empty({10, 7});
  init_parameter_rows(whole, "model.layers.0.mlp.up_proj.weight", 0, 42, 0.02f);
  Tensor top = Tensor::empty({4, 7}), bottom = Tensor::empty({6, 7});
  init_parameter_rows(top, "model.layers.0.mlp.up_proj.weight", 0, 42, 0.02f);
  init_parameter_rows(bottom, "model.layers.0.mlp.up_proj.weight", 4, 42, 0.02f);
  for (int64_t i = 0; i < 28; ++i) CHECK(whole.data<float>()[i] == top.data<float>()[i]);
  for (int64_t i = 0; i < 42; ++i) CHECK(whole.data<float>()[28 + i] == bottom.data<float>()[i]);
  // and the draws look like N(0, 0.02^2)
  double sum = 0, sq = 0;
  Tensor big = Tensor::empty({200, 101});
  init_parameter_rows(big, "w", 0, 1, 0.02f);
  for (int64_t i = 0; i < big.numel(); ++i) {
    sum += big.data<float>()[i];
    sq += double(big.data<float>()[i]) * big.data<float>()[i];
  }
  const double n = double(big.numel());
  CHECK(std::abs(sum / n) < 3 * 0.02 / std::sqrt(n) * 1.5);
  CHECK(std::sqrt(sq / n) == Approx(0.02).epsilon(0.02));
}
