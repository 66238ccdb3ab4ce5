// Context parallelism: the whole model trained with ring attention over cp ranks (and
// ZeRO-3 over all dp x cp ranks) equals one rank with ordinary attention on the same global
// batch: cp = 1, 2, 4, and dp = 2 x cp = 2, at a sequence length that is not a multiple of
// 2 cp (padding), with grouped-query attention; and with rotary scaling whose tables depend on
// the whole sequence's length (dynamic) or scale cos and sin (YaRN), which every rank of the
// ring must apply alike.
#include <cmath>
#include <random>

#include "catch_compat.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model_support.h"
#include "optim/adamw.h"
#include "parallel/mesh.h"
#include "parallel/ring_attention.h"
#include "parallel/zero3_parameters.h"
#include "train/train_step.h"

using namespace frugal;

namespace {

constexpr int64_t kSequences = 4, kSeq = 37;

LlamaConfig gqa_config(RopeScaling scaling = {}, int64_t sliding_window = 0) {
  LlamaConfig c;
  c.hidden_size = 48;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.vocab_size = 41;
  c.max_position_embeddings = 64;
  c.rope_theta = 500;
  c.rope_scaling = scaling;
  c.sliding_window = sliding_window;
  // Dynamic scaling grows the base past max_position_embeddings: the sequences pass it.
  if (scaling.type == RopeScalingType::dynamic) c.max_position_embeddings = 16;
  return c;
}

// Sequences [first, first + count) of the step's global batch.
Batch sequences(int64_t first, int64_t count, int64_t step) {
  return test::slice_of_random_batch(uint32_t(77 + step), kSequences, kSeq, 41, first, count, 9);
}

void check_against_one_rank(int cp, RopeScaling scaling = {}, int64_t sliding_window = 0) {
  Mesh mesh = make_mesh(cp, 60);
  const LlamaConfig config = gqa_config(scaling, sliding_window);
  const AdamWConfig adamw{0.9, 0.95, 1e-6, 0.1, 1.0};

  LlamaModel reference_model(config);
  LocalParameters whole(config, 3, 0.05f, true);
  AdamW whole_opt(whole.trainable(), adamw);

  LlamaModel model(config);
  const AttentionOperator ring = ring_attention_operator(*mesh.cp);
  model.set_attention(&ring);
  Arena params_arena("cp params", Device::cpu), grads_arena("cp grads", Device::cpu),
      gathered_arena("cp gathered", Device::cpu), optim_arena("cp optim", Device::cpu);
  Zero3Parameters sharded(llama_units(config), *mesh.world,
                          {&params_arena, &grads_arena, &gathered_arena}, 3, 0.05f);
  AdamW sharded_opt(sharded.trainable(), adamw, optim_arena);

  const int64_t per_dp = kSequences / mesh.dp_size;
  const ZigzagLayout layout = zigzag_layout(kSeq, mesh.cp_size, mesh.cp_rank);
  for (int64_t step = 1; step <= 3; ++step) {
    StepResult a = train_step(reference_model, whole, whole_opt, {sequences(0, kSequences, step)},
                              nullptr, 2e-3, step, CheckpointPolicy::none);
    Batch local = context_parallel_slice(sequences(mesh.dp_rank * per_dp, per_dp, step), layout);
    StepResult b = train_step(model, sharded, sharded_opt, {local}, mesh.world.get(), 2e-3, step,
                              CheckpointPolicy::selective);
    INFO("step " << step << ", dp " << mesh.dp_size << " x cp " << mesh.cp_size);
    CHECK(b.tokens == a.tokens);
    CHECK(b.loss == Approx(a.loss).epsilon(1e-5));
    CHECK(b.grad_norm == Approx(a.grad_norm).epsilon(1e-4));
  }
  std::string worst;
  const double difference =
      test::max_weight_difference(sharded, whole, llama_units(config), &worst);
  INFO("largest weight difference " << difference << " at " << worst);
  CHECK(difference < 1e-5);
}

}  // namespace

TEST_CASE("ring attention training equals one rank", "[cp][mpi]") {
  const int world = mpi_world_size();
  SECTION("cp = every rank") { check_against_one_rank(world); }
  if (world == 4) {
    SECTION("dp = 2 x cp = 2") { check_against_one_rank(2); }
  }
  SECTION("dynamic rotary scaling past the context") {
    RopeScaling dynamic;
    dynamic.type = RopeScalingType::dynamic;
    dynamic.factor = 3;
    check_against_one_rank(world, dynamic);
  }
  SECTION("Mistral's sliding window, shorter than a rank's rows") {
    check_against_one_rank(world, {}, 6);
  }
  SECTION("YaRN") {
    RopeScaling yarn;
    yarn.type = RopeScalingType::yarn;
    yarn.factor = 4;
    yarn.original_max_position_embeddings = 16;
    check_against_one_rank(world, yarn);
  }
}
