// LoRA adapters: the model's gradient with respect to every adapter against central finite
// differences of its loss (awkward sizes, GQA, each checkpoint policy, a subset of targets),
// no gradient for the frozen base, a fresh adapter (B = 0) leaving the base model's loss
// unchanged, and the adapter layout.
#include <cmath>
#include <random>

#include "catch_compat.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model/lora.h"
#include "model_support.h"
#include "ops/ops.h"
#include "test_support.h"

using namespace frugal;

namespace {

LlamaConfig awkward_config(Architecture architecture = Architecture::llama) {
  LlamaConfig c;
  c.architecture = architecture;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.vocab_size = 37;
  c.max_position_embeddings = 64;
  return c;
}

LoraConfig lora_of(int64_t rank, const std::string& targets) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = 2.5 * double(rank);  // a scale of 2.5, so a wrong scale shows
  l.targets = lora_targets_from_names(targets);
  return l;
}

double mean_loss(LlamaModel& model, ParameterProvider& params, const Batch& b) {
  return model.forward_loss(b, params) / static_cast<double>(counted_targets(b.targets));
}

// Gives every B random values (a fresh adapter has B = 0, where A's gradient vanishes).
void randomize_b(LocalParameters& params, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (TrainableShard& s : params.trainable())
    if (is_lora_b(s.name))
      for (int64_t i = 0; i < s.param.numel(); ++i) s.param.data<float>()[i] = normal(rng);
}

// With dropout the loss is that of the training forward with the same masks.
double training_loss(LlamaModel& model, LocalParameters& params, const Batch& b,
                     CheckpointPolicy policy) {
  return model.forward_backward(b, params, 0.0f, policy) /
         static_cast<double>(counted_targets(b.targets));
}

void check_gradients(const LoraConfig& lora, CheckpointPolicy policy,
                     Architecture architecture = Architecture::llama) {
  const LlamaConfig config = awkward_config(architecture);
  LlamaModel model(config);
  model.set_lora(&lora);
  LocalParameters params(lora_units(config, lora), 7, 0.1f, true);
  randomize_b(params, 5);
  const Batch b = test::slice_of_random_batch(11, 2, 13, config.vocab_size, 0, 2, 5);
  const float scale = 1.0f / static_cast<float>(counted_targets(b.targets));
  model.set_noise(lora.dropout > 0 ? 77 : 0);  // the same masks in every evaluation below
  params.zero_grads();
  model.forward_backward(b, params, scale, policy);
  const std::vector<TrainableShard> grads_now = params.trainable();
  std::vector<Tensor> grads;
  for (const TrainableShard& s : grads_now) grads.push_back(s.grad.clone());

  // Only adapters train: 2 per target projection and layer.
  const std::vector<TrainableShard> shards = params.trainable();
  CHECK(shards.size() == 2 * lora.targets.size() * size_t(config.num_hidden_layers));
  for (const TrainableShard& s : shards) CHECK((is_lora_a(s.name) || is_lora_b(s.name)));
  CHECK_FALSE(params.grads(block_unit(0), GradSums::kSeveral).tensors[kQProj].defined());
  // Qwen2's biases are the base's: frozen with it.
  if (config.qkv_bias())
    CHECK_FALSE(
        params.grads(block_unit(0), GradSums::kSeveral).tensors[kBlockParamCount].defined());
  CHECK_FALSE(params.grads(embed_unit(), GradSums::kSeveral).tensors[0].defined());

  std::mt19937 rng(3);
  for (size_t k = 0; k < shards.size(); ++k) {
    const TrainableShard& s = shards[k];
    const test::DirectionalDerivative d = test::directional_derivative(s.param, grads[k], rng, [&] {
      return lora.dropout > 0 ? training_loss(model, params, b, policy)
                              : mean_loss(model, params, b);
    });
    const double analytic = d.analytic, numeric = d.numeric;
    INFO(s.name << ": analytic " << analytic << " numeric " << numeric);
    CHECK(std::abs(analytic - numeric) <= 2e-3 * std::abs(numeric) + 5e-5);
  }
}

}  // namespace

TEST_CASE("LoRA adapter gradients equal finite differences", "[lora]") {
  SECTION("every projection, no checkpointing") {
    check_gradients(lora_of(4, "all"), CheckpointPolicy::none);
  }
  SECTION("q and v only, rank 3, selective") {
    check_gradients(lora_of(3, "q_proj,v_proj"), CheckpointPolicy::selective);
  }
  SECTION("MLP only, rank 2, full recompute") {
    check_gradients(lora_of(2, "gate_proj,up_proj,down_proj"), CheckpointPolicy::full);
  }
  SECTION("Qwen2 (q/k/v biases, frozen), every projection, selective") {
    check_gradients(lora_of(2, "all"), CheckpointPolicy::selective, Architecture::qwen2);
  }
  SECTION("dropout 0.3 on every adapter, full recompute draws the same masks") {
    LoraConfig lora = lora_of(3, "all");
    lora.dropout = 0.3;
    lora.seed = 5;
    check_gradients(lora, CheckpointPolicy::full);
  }
}

TEST_CASE("dropout keeps 1 - p of the elements, scaled, and is its own adjoint", "[lora]") {
  const int64_t n = 200000;
  Tensor ones = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) ones.data<float>()[i] = 1.0f;
  const Tensor y = ops::dropout(ones, 0.25f, 42);
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = y.data<float>()[i];
    if (v == 0.0f)
      ++dropped;
    else
      CHECK(v == 1.0f / 0.75f);
  }
  // Binomial(200000, 0.25): standard deviation 194; 5 of them either side.
  CHECK(std::abs(double(dropped) - 0.25 * n) < 5 * std::sqrt(n * 0.25 * 0.75));
  // The same seed draws the same mask; another seed another one.
  const Tensor again = ops::dropout(ones, 0.25f, 42), other = ops::dropout(ones, 0.25f, 43);
  int64_t same = 0, differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    same += again.data<float>()[i] == y.data<float>()[i];
    differ += other.data<float>()[i] != y.data<float>()[i];
  }
  CHECK(same == n);
  CHECK(differ > n / 4);
  // A chunk of rows with its first element's index draws the rows' part of the whole mask.
  Tensor grid = ones.view({n / 8, 8});
  const Tensor chunk = ops::dropout(grid.rows(1000, 1234), 0.25f, 42, 1000 * 8);
  int64_t chunk_same = 0;
  for (int64_t i = 0; i < 234 * 8; ++i)
    chunk_same += chunk.data<float>()[i] == y.data<float>()[1000 * 8 + i];
  CHECK(chunk_same == 234 * 8);
  // <d(x), z> == <x, d(z)>: the backward is the same function.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  Tensor x = Tensor::empty({1000}), z = Tensor::empty({1000});
  for (int64_t i = 0; i < 1000; ++i)
    x.data<float>()[i] = normal(rng), z.data<float>()[i] = normal(rng);
  const Tensor dx = ops::dropout(x, 0.4f, 9), dz = ops::dropout(z, 0.4f, 9);
  double left = 0, right = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    left += double(dx.data<float>()[i]) * z.data<float>()[i];
    right += double(x.data<float>()[i]) * dz.data<float>()[i];
  }
  CHECK(left == Approx(right).epsilon(1e-6));  // fp32 roundings of x / (1 - p)
}

TEST_CASE("a fresh LoRA model is the base model", "[lora]") {
  const LlamaConfig config = awkward_config();
  const LoraConfig lora = lora_of(4, "all");
  LlamaModel base_model(config), lora_model(config);
  lora_model.set_lora(&lora);
  LocalParameters base(config, 9, 0.05f, false);
  LocalParameters adapted(lora_units(config, lora), 9, 0.05f, false);
  const Batch b = test::slice_of_random_batch(4, 2, 13, config.vocab_size, 0, 2, 5);
  // B = 0: the adapters add exactly zero, and the base weights are initialised by name.
  CHECK(mean_loss(lora_model, adapted, b) == mean_loss(base_model, base, b));
  const Tensor& a = adapted.param("model.layers.1.mlp.down_proj.lora_A.weight");
  CHECK(a.shape() == Shape({4, config.intermediate_size}));
  const double bound = 1.0 / std::sqrt(double(config.intermediate_size));
  double largest = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    largest = std::max(largest, double(std::abs(a.data<float>()[i])));
  CHECK(largest <= bound);
  CHECK(largest > 0.5 * bound);  // uniform over the whole range, not a narrow normal
  CHECK(adapted.param("model.layers.0.self_attn.k_proj.lora_B.weight").shape() ==
        Shape({config.num_key_value_heads * 16, 4}));
}

TEST_CASE("LoRA targets by name", "[lora]") {
  CHECK(lora_targets_from_names("all").size() == 7);
  CHECK(lora_target_names(lora_targets_from_names("v_proj,q_proj,v_proj")) == "q_proj,v_proj");
  const std::string message = test::error_of([] { lora_targets_from_names("q_proj,attn"); });
  CHECK(test::contains(message, "lora.targets"));
  CHECK(test::contains(message, "'attn'"));
}
