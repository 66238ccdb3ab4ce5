// The memory floor of a run from its size keys alone (plan/memory_plan.h): every size key that
// makes a run impossible is refused by name before a table or tensor is made, with arithmetic
// that cannot wrap; the floor's weights agree with the parameter table.
#include <functional>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "config/train_config.h"
#include "model/llama_config.h"
#include "plan/memory_plan.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;

namespace {

constexpr size_t kGiB = size_t(1) << 30;

// A small run that fits: the tests' usual shape.
TrainConfig small_run() {
  TrainConfig c;
  c.model.hidden_size = 64;
  c.model.intermediate_size = 96;
  c.model.num_hidden_layers = 2;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.vocab_size = 320;
  c.model.max_position_embeddings = 64;
  c.train.seq_len = 32;
  c.train.micro_batch_size = 4;
  return c;
}

// The refusal of `c` on one CPU rank of a node with 16 GiB available ("" when it fits).
std::string refusal_on_cpu(const TrainConfig& c) {
  return error_of([&] { check_memory_floor(memory_floor(c, 1, 1, false), 1, 16 * kGiB, 0); });
}

size_t part_bytes(const std::vector<MemoryFloorPart>& parts, const std::string& starts_with) {
  for (const MemoryFloorPart& p : parts)
    if (p.what.rfind(starts_with, 0) == 0) return p.bytes;
  FAIL("no part " << starts_with);
  return 0;
}

}  // namespace

TEST_CASE("memory floor: a run that fits passes, its weights as in the parameter table", "[plan]") {
  TrainConfig c = small_run();
  REQUIRE_NOTHROW(c.validate());
  CHECK(refusal_on_cpu(c).empty());
  // Full training with AdamW in fp32: 16 bytes a parameter (master, gradient, two moments).
  const std::vector<MemoryFloorPart> parts = memory_floor(c, 1, 1, false);
  const int64_t h = c.model.hidden_size, vocab = c.model.vocab_size;
  const int64_t embedding = vocab * h * (c.model.tie_word_embeddings ? 1 : 2);
  const int64_t blocks = c.model.parameter_count() - embedding - h;  // the final norm
  CHECK(part_bytes(parts, "the blocks' weights") == size_t(blocks) * 16);
  CHECK(part_bytes(parts, "the embedding") == size_t(embedding) * 16);
  // Over 3 shard ranks, a third of it (rounded down: a floor).
  CHECK(part_bytes(memory_floor(c, 3, 1, false), "the blocks' weights") == size_t(blocks) * 16 / 3);
  // LoRA: the base frozen in fp32 on the CPU, 4-bit under QLoRA.
  c.train.type = TrainType::lora;
  CHECK(part_bytes(memory_floor(c, 1, 1, false), "the frozen blocks' weights") ==
        size_t(blocks) * 4);
  c.train.type = TrainType::qlora;
  CHECK(part_bytes(memory_floor(c, 1, 1, false), "the frozen blocks' weights") ==
        size_t(blocks) / 2);
}

TEST_CASE("memory floor: each size key that makes a run impossible is named", "[plan]") {
  struct Case {
    std::string named;  // what the message must hold
    std::function<void(TrainConfig&)> change;
  };
  const std::vector<Case> cases = {
      {"model.num_hidden_layers = 1000000000",
       [](TrainConfig& c) { c.model.num_hidden_layers = 1000000000; }},
      {"model.hidden_size = 4000000", [](TrainConfig& c) { c.model.hidden_size = 4000000; }},
      {"model.intermediate_size = 100000000000",
       [](TrainConfig& c) { c.model.intermediate_size = 100000000000; }},
      {"model.num_attention_heads = 400000000",
       [](TrainConfig& c) {
         c.model.head_dim = 16;
         c.model.num_attention_heads = 400000000;
         c.model.num_key_value_heads = 2;
       }},
      {"model.num_key_value_heads = 400000000",
       [](TrainConfig& c) {
         c.model.head_dim = 16;
         c.model.num_attention_heads = 400000000;
         c.model.num_key_value_heads = 400000000;
       }},
      {"model.head_dim = 2000000000", [](TrainConfig& c) { c.model.head_dim = 2000000000; }},
      {"model.vocab_size = 100000000000",
       [](TrainConfig& c) { c.model.vocab_size = 100000000000; }},
      {"train.micro_batch_size = 100000000000",
       [](TrainConfig& c) { c.train.micro_batch_size = 100000000000; }},
      {"train.seq_len = 100000000000",
       [](TrainConfig& c) {
         c.model.max_position_embeddings = 100000000000;
         c.train.seq_len = 100000000000;
       }},
      {"lora.rank = 100000000000",
       [](TrainConfig& c) {
         c.train.type = TrainType::lora;
         c.lora.rank = 100000000000;
       }},
      {"fp8.amax_history_len = 100000000000",
       [](TrainConfig& c) {
         c.fp8.enabled = true;
         c.fp8.amax_history_len = 100000000000;
       }},
      // Past 2^64 bytes: saturated, never wrapped into a small number that would pass.
      {"model.num_hidden_layers = 9223372036854775807",
       [](TrainConfig& c) { c.model.num_hidden_layers = INT64_MAX; }},
      {"more than 16 EiB",
       [](TrainConfig& c) {
         c.model.hidden_size = 4294967296;
         c.model.intermediate_size = 4294967296;
       }},
  };
  for (const Case& k : cases) {
    INFO(k.named);
    TrainConfig c = small_run();
    k.change(c);
    const std::string message = refusal_on_cpu(c);
    CHECK(contains(message, k.named));
  }
  // GaLore's rank is bounded by each matrix's sides (galore_rank_of): no part grows with it.
  TrainConfig c = small_run();
  c.optim.type = OptimizerType::galore_adamw;
  c.galore.rank = INT64_MAX;
  CHECK(refusal_on_cpu(c).empty());
}

TEST_CASE("memory floor: on a GPU, activations count against the device", "[plan]") {
  TrainConfig c = small_run();
  c.train.micro_batch_size = 10000000;  // 320 M tokens: 76 GiB of block inputs in bf16
  const std::vector<MemoryFloorPart> parts = memory_floor(c, 1, 1, true);
  const std::string message = error_of([&] { check_memory_floor(parts, 1, 64 * kGiB, 24 * kGiB); });
  CHECK(contains(message, "train.micro_batch_size = 10000000 "));
  CHECK(contains(message, "of GPU memory per rank"));
  // The same run offloads the blocks' inputs to the host: the host must take them.
  c.train.activation_offload = ActivationOffload::inputs;
  const std::string offloaded =
      error_of([&] { check_memory_floor(memory_floor(c, 1, 1, true), 8, 64 * kGiB, 80 * kGiB); });
  CHECK(contains(offloaded, "the blocks' inputs kept for the backward"));
  CHECK(contains(offloaded, "of host memory per rank (8 rank(s) on this node"));
}
