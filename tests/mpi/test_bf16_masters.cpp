// bf16 master weights with stochastic rounding (optim.master_dtype = bf16, fp32 moments) under
// ZeRO-3 on CPU ranks. The rounding's bits are keyed by each element's index in the whole
// parameter, so the number of ranks does not change them: with every rank training on the
// same batch (its gradients summed over 2 ranks are exactly twice half of one rank's, the loss
// being normalised by the tokens of all ranks), 2 ranks give one rank's weights bit for bit.
// With other rank counts the sums round differently (3: the normalisation is no power of two;
// 4 and 8: the order of the reduce-scatter's sums), so there only closeness is asked. And a
// checkpoint of bf16 masters resumes bit for bit, and loads onto one rank as the same weights.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "ckpt/checkpoint_manager.h"
#include "model/llama_model.h"
#include "model_support.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "parallel/zero3_parameters.h"
#include "parallel/zero3_state.h"
#include "train/train_step.h"

using namespace frugal;

namespace {

LlamaConfig odd_config() {
  LlamaConfig c;
  c.hidden_size = 48;
  c.intermediate_size = 70;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.vocab_size = 37;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = false;
  return c;
}

AdamWConfig bf16_adamw() {
  AdamWConfig a;
  a.eps = 1e-6;
  a.weight_decay = 0.1;
  a.grad_clip = 0;  // a clipped step would scale by a norm whose sums depend on the sharding
  a.moments = DType::f32;
  a.bf16_stochastic = true;
  a.rounding_seed = 99;
  return a;
}

// The same batch of 4 sequences of 13 tokens on every rank, per step.
std::vector<Batch> batch_of(int64_t step) {
  return {test::slice_of_random_batch(uint32_t(500 + step), 4, 13, 37, 0, 4, 7)};
}

// A model's bf16 master weights and optimizer on `comm`'s ranks.
struct Run {
  Arena params{"test params", Device::cpu}, grads{"test grads", Device::cpu},
      gathered{"test gathered", Device::cpu}, optim{"test optim", Device::cpu};
  Zero3Parameters weights;
  AdamW optimizer;
  Zero3State state{weights};
  Run(const LlamaConfig& config, Comm& comm)
      : weights(llama_units(config), comm, {&params, &grads, &gathered, nullptr, DType::bf16}, 5,
                0.05f),
        optimizer(weights.trainable(), bf16_adamw(), optim) {}
  void train(LlamaModel& model, Comm* comm, int64_t first, int64_t last) {
    for (int64_t step = first; step <= last; ++step)
      train_step(model, weights, optimizer, batch_of(step), comm, 1e-3, step,
                 CheckpointPolicy::none);
  }
};

// Every weight, gathered whole (a collective), as the bits of its fp32 widening.
std::vector<std::vector<float>> all_weights(Zero3Parameters& weights, size_t units) {
  std::vector<std::vector<float>> out;
  for (size_t u = 0; u < units; ++u) {
    for (const Tensor& w : weights.gather(int64_t(u)))
      out.emplace_back(w.data<float>(), w.data<float>() + w.numel());
    weights.release(int64_t(u));
  }
  return out;
}

double max_difference(const std::vector<std::vector<float>>& a,
                      const std::vector<std::vector<float>>& b) {
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j)
      largest = std::max(largest, std::abs(double(a[i][j]) - double(b[i][j])));
  return largest;
}

}  // namespace

TEST_CASE("bf16 masters with stochastic rounding: 2 ranks equal one rank bit for bit",
          "[bf16_masters][mpi]") {
  auto world = make_mpi_world_comm(60);
  const std::unique_ptr<Comm> alone = world->split(world->rank(), 0);
  const int ranks = world->size();
  const LlamaConfig config = odd_config();
  const size_t units = llama_units(config).size();
  LlamaModel model(config);

  Run one(config, *alone), sharded(config, *world);
  // The masters and gradient shards take 2 bytes a weight: half of one rank's on 2 ranks.
  CHECK(one.params.stats().in_use_bytes == size_t(config.parameter_count()) * 2);
  one.train(model, nullptr, 1, 4);
  sharded.train(model, world.get(), 1, 4);
  const auto expected = all_weights(one.weights, units);
  const auto got = all_weights(sharded.weights, units);
  const auto initial = [&] {
    Run fresh(config, *alone);
    return all_weights(fresh.weights, units);
  }();
  INFO(ranks << " ranks");
  CHECK(max_difference(expected, initial) > 0);  // it trained
  if (ranks <= 2) {
    CHECK(got == expected);
  } else {
    // A few bf16 steps of the weights (~0.05: a step is 2^-12 or less) apart at most.
    CHECK(max_difference(got, expected) < 4e-3);
  }

  // Round to nearest gives other weights: the rounding is in force.
  AdamWConfig nearest_config = bf16_adamw();
  nearest_config.bf16_stochastic = false;
  Arena p("p", Device::cpu), g("g", Device::cpu), ga("ga", Device::cpu), o("o", Device::cpu);
  Zero3Parameters nearest(llama_units(config), *alone, {&p, &g, &ga, nullptr, DType::bf16}, 5,
                          0.05f);
  AdamW nearest_opt(nearest.trainable(), nearest_config, o);
  for (int64_t step = 1; step <= 4; ++step)
    train_step(model, nearest, nearest_opt, batch_of(step), nullptr, 1e-3, step,
               CheckpointPolicy::none);
  CHECK(all_weights(nearest, units) != expected);
}

TEST_CASE("bf16 masters resume bit for bit, and load on one rank as the same weights",
          "[bf16_masters][mpi][ckpt]") {
  auto world = make_mpi_world_comm(60);
  const std::unique_ptr<Comm> alone = world->split(world->rank(), 0);
  const int rank = world->rank(), ranks = world->size();
  const LlamaConfig config = odd_config();
  const size_t units = llama_units(config).size();
  LlamaModel model(config);
  const auto agree = [&world](bool ok) { return world->all_reduce_max(ok ? 0 : 1) == 0; };
  std::string dir;
  if (rank == 0) {
    char name[] = "/tmp/frugal-bf16-masters-XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr);
    dir = name;
  }
  dir = world->broadcast_string(dir, 0);

  Run straight(config, *world);
  straight.train(model, world.get(), 1, 6);

  Run first(config, *world);
  first.train(model, world.get(), 1, 3);
  {
    CheckpointManager saver(CheckpointDir(dir), rank, ranks, agree,
                            {{"weights", &first.state}, {"optim", &first.optimizer}}, 2);
    world->barrier();
    saver.save(3);
  }
  const auto saved = all_weights(first.weights, units);
  Run resumed(config, *world);
  {
    CheckpointManager loader(CheckpointDir(dir), rank, ranks, agree,
                             {{"weights", &resumed.state}, {"optim", &resumed.optimizer}}, 2);
    world->barrier();
    loader.load(3);
  }
  CHECK(all_weights(resumed.weights, units) == saved);
  resumed.train(model, world.get(), 4, 6);
  CHECK(all_weights(resumed.weights, units) == all_weights(straight.weights, units));

  // These ranks' checkpoint on one rank: the same bf16 values.
  if (rank == 0) {
    Run on_one(config, *alone);
    CheckpointManager(
        CheckpointDir(dir), 0, 1, [](bool ok) { return ok; },
        {{"weights", &on_one.state}, {"optim", &on_one.optimizer}}, 2)
        .load(3);
    CHECK(all_weights(on_one.weights, units) == saved);
  }
  world->barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}
