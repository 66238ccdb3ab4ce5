// Sequence-chunked MLP, the head and loss in chunks of rows, and activation offload against the
// plain path, on awkward sizes (hidden 48, ffn 80, 2 sequences of 13 tokens cut into chunks of
// 5, 7 and 25 rows), for every checkpoint policy, full training and LoRA with dropout. A chunk's
// rows go through the same per-token kernels, but OpenBLAS picks its GEMM kernels by the number
// of rows and the weight gradients sum over the chunks in turn, so a chunked run equals the
// plain one to fp32 rounding (measured: relative 1e-9 on the loss); offloaded inputs change no
// bit, and their host memory is every block's input but the last.
#include <cmath>

#include "catch_compat.h"
#include "model/llama_mlp.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model/lora.h"
#include "model_support.h"

using namespace frugal;

namespace {

LlamaConfig awkward_config() {
  LlamaConfig c;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.vocab_size = 37;
  c.max_position_embeddings = 64;
  c.rope_theta = 500.0;
  return c;
}

struct Run {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // by trainable tensor
  std::vector<std::string> names;
};

struct Settings {
  CheckpointPolicy policy = CheckpointPolicy::none;
  int64_t chunk = 0;         // train.mlp_chunk_tokens (0: the automatic choice: whole here)
  Arena* offload = nullptr;  // activation offload's host arena
  const LoraConfig* lora = nullptr;
  int64_t loss_chunk = kDefaultLossChunkTokens;  // train.loss_chunk_tokens (whole here)
};

Run run(const Settings& s) {
  const LlamaConfig config = awkward_config();
  LlamaModel model(config);
  model.set_mlp_chunk_tokens(s.chunk);
  model.set_loss_chunk_rows(s.loss_chunk);
  model.set_input_offload(s.offload);
  std::vector<UnitSpec> units = llama_units(config);
  if (s.lora) {
    model.set_lora(s.lora);
    model.set_noise(s.lora->dropout > 0 ? 77 : 0);
    units = lora_units(config, *s.lora);
  }
  LocalParameters params(units, 9, 0.1f, true);
  const Batch b = test::slice_of_random_batch(5, 2, 13, config.vocab_size, 0, 2, 5);
  const float scale = 1.0f / static_cast<float>(counted_targets(b.targets));
  Run r;
  r.loss = model.forward_backward(b, params, scale, s.policy);
  for (const TrainableShard& t : params.trainable()) {
    r.names.push_back(t.name);
    r.grads.emplace_back(t.grad.data<float>(), t.grad.data<float>() + t.grad.numel());
  }
  return r;
}

// exact: the same bits; else every gradient within 1e-5 of its tensor's largest.
void check_same(const Run& plain, const Run& other, bool exact) {
  if (exact)
    CHECK(other.loss == plain.loss);
  else
    CHECK(other.loss == Approx(plain.loss).epsilon(1e-7));
  REQUIRE(other.grads.size() == plain.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    INFO(plain.names[i]);
    const std::vector<float>&a = plain.grads[i], &b = other.grads[i];
    double largest = 0, diff = 0;
    int64_t unequal = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      largest = std::max(largest, double(std::abs(a[j])));
      diff = std::max(diff, double(std::abs(a[j] - b[j])));
      unequal += a[j] != b[j];
    }
    if (exact) {
      CHECK(unequal == 0);
    } else {
      INFO("largest |gradient| " << largest << ", largest difference " << diff);
      CHECK(diff <= 1e-5 * largest);
    }
  }
}

}  // namespace

TEST_CASE("the automatic MLP chunk: whole for short sequences, rows of half a hidden tensor",
          "[mlp_chunks]") {
  LlamaConfig tiny;  // TinyLlama-1.1B's widths
  tiny.hidden_size = 2048;
  tiny.intermediate_size = 5632;
  CHECK(mlp_chunk_rows(8192, tiny, 0) == 8192);
  CHECK(mlp_chunk_rows(16384, tiny, 0) == 16384);
  // 131072 x 2048 / 2 / 5632 = 23831.3 rows -> 24576 (a multiple of 1024): six chunks, the last
  // one 8192 rows.
  CHECK(mlp_chunk_rows(131072, tiny, 0) == 24576);
  CHECK(mlp_chunk_rows(32768, tiny, 0) == 8192);  // 5958 rows, raised to the floor
  CHECK(mlp_chunk_rows(131072, tiny, 5000) == 5000);
  CHECK(mlp_chunk_rows(100, tiny, 5000) == 100);
}

TEST_CASE("the head and loss in chunks of rows give the whole one's loss and gradients",
          "[loss_chunks]") {
  // 26 rows (2 sequences of 13): the default takes them whole; 5 and 7 leave a short last
  // chunk, 13 ends each chunk with a sequence.
  const Run plain = run({});
  for (int64_t rows : {5, 7, 13}) {
    INFO("chunks of " << rows << " rows");
    Settings s;
    s.loss_chunk = rows;
    check_same(plain, run(s), false);
  }
}

TEST_CASE("a chunked MLP gives the unchunked gradients under every policy", "[mlp_chunks]") {
  for (CheckpointPolicy policy :
       {CheckpointPolicy::none, CheckpointPolicy::selective, CheckpointPolicy::full}) {
    const Run plain = run({policy, 0, nullptr, nullptr});
    for (int64_t chunk : {5, 7, 25}) {
      INFO(checkpoint_policy_name(policy) << ", chunks of " << chunk << " rows");
      check_same(plain, run({policy, chunk, nullptr, nullptr}), false);
    }
  }
}

TEST_CASE("a chunked MLP with LoRA adapters and dropout draws the unchunked masks",
          "[mlp_chunks]") {
  LoraConfig lora;
  lora.rank = 3;
  lora.alpha = 6;
  lora.dropout = 0.3;
  lora.targets = lora_targets_from_names("all");
  for (CheckpointPolicy policy :
       {CheckpointPolicy::none, CheckpointPolicy::selective, CheckpointPolicy::full}) {
    INFO(checkpoint_policy_name(policy));
    check_same(run({policy, 0, nullptr, &lora}), run({policy, 6, nullptr, &lora}), false);
  }
}

TEST_CASE("offloaded inputs give the same bits, and hold every input but the last",
          "[activation_offload]") {
  for (CheckpointPolicy policy :
       {CheckpointPolicy::none, CheckpointPolicy::selective, CheckpointPolicy::full}) {
    INFO(checkpoint_policy_name(policy));
    Arena host("activation inputs (host, offloaded)", Device::cpu);
    const Run plain = run({policy, 0, nullptr, nullptr});
    check_same(plain, run({policy, 0, &host, nullptr}), true);
    // 2 of the 3 blocks' inputs, 26 rows of 48 fp32 values each, all held at the end of the
    // forward; every one given back by the end of the backward.
    CHECK(host.stats().peak_bytes == size_t(2 * 26 * 48 * 4));
    CHECK(host.stats().in_use_bytes == 0);
    // Together with the chunked MLP: the chunked run's bits.
    const Run chunked = run({policy, 7, nullptr, nullptr});
    check_same(chunked, run({policy, 7, &host, nullptr}), true);
  }
}

TEST_CASE("the recompute check sees a perturbed recompute of a chunked MLP", "[mlp_chunks]") {
  const LlamaConfig config = awkward_config();
  for (CheckpointPolicy policy : {CheckpointPolicy::selective, CheckpointPolicy::full})
    for (int64_t perturbed : {-1, 1}) {
      INFO(checkpoint_policy_name(policy) << ", perturbed layer " << perturbed);
      LlamaModel model(config);
      model.set_mlp_chunk_tokens(7);
      RecomputeCheck check;
      check.perturb_layer = perturbed;
      model.set_recompute_check(&check);
      LocalParameters params(config, 9, 0.1f, true);
      const Batch b = test::slice_of_random_batch(5, 2, 13, config.vocab_size, 0, 2, 5);
      model.forward_backward(b, params, 0.01f, policy);
      CHECK(check.blocks_checked == 3);
      REQUIRE(check.mismatches.size() == (perturbed < 0 ? 0u : 1u));
      if (perturbed >= 0) CHECK(check.mismatches[0].layer == 1);
    }
}
