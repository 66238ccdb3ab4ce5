// The check of the context-parallel training tests (test_context_parallel, test_ring_documents):
// three steps of a model on ring attention over the cp ranks of a mesh (ZeRO-3 over every rank)
// against one rank's steps with ordinary attention on the same global batch: the same trained
// tokens, losses and gradient norms, and weights within 1e-5 at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "catch_compat.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model_support.h"
#include "optim/adamw.h"
#include "parallel/mesh.h"
#include "parallel/ring_attention.h"
#include "parallel/zero3_parameters.h"
#include "train/train_step.h"

namespace frugal::test {

// The tiny model both tests train: grouped-query attention (3 query heads over 1), 2 layers.
inline LlamaConfig cp_test_config(RopeScaling scaling = {}, int64_t sliding_window = 0) {
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

// Sequences [first, first + count) of a step's global batch, the same on every rank.
using StepSequences = std::function<Batch(int64_t first, int64_t count, int64_t step)>;

// `sequences_per_step` sequences of `seq` tokens a step, split over the mesh's dp groups.
inline void check_cp_training_against_one_rank(int cp, const LlamaConfig& config,
                                               int64_t sequences_per_step, int64_t seq,
                                               const StepSequences& sequences) {
  Mesh mesh = make_mesh(cp, 60);
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

  const int64_t per_dp = sequences_per_step / mesh.dp_size;
  const ZigzagLayout layout = zigzag_layout(seq, mesh.cp_size, mesh.cp_rank);
  for (int64_t step = 1; step <= 3; ++step) {
    StepResult a =
        train_step(reference_model, whole, whole_opt, {sequences(0, sequences_per_step, step)},
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
  const double difference = max_weight_difference(sharded, whole, llama_units(config), &worst);
  INFO("largest weight difference " << difference << " at " << worst);
  CHECK(difference < 1e-5);
}

}  // namespace frugal::test
