// The memory plan of a run (plan/memory_plan.h), worked out before anything is allocated,
// against what ZeRO-3 and AdamW then allocate on this rank, counted by their arenas: equal for
// full, LoRA and QLoRA training (padded row shards on 1, 2, 4 and 8 ranks; NF4's and HQQ's
// codes and block scales).
#include <algorithm>
#include <memory>

#include "catch_compat.h"
#include "ckpt/checkpoint_manager.h"
#include "model/llama_config.h"
#include "model/lora.h"
#include "optim/adamw.h"
#include "optim/galore_adamw.h"
#include "parallel/comm.h"
#include "parallel/zero3_parameters.h"
#include "parallel/zero3_state.h"
#include "plan/memory_plan.h"

using namespace frugal;

namespace {

LlamaConfig odd_config() {
  LlamaConfig c;
  c.hidden_size = 128;  // 4-bit rows must be multiples of 64
  c.intermediate_size = 192;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 37;
  c.max_position_embeddings = 32;
  return c;
}

struct Measured {
  size_t params, grads, optimizer, gathered_per_unit;
};

Measured allocate(const std::vector<UnitSpec>& units, Comm& comm, const Zero3Init& init) {
  Arena params("plan params", Device::cpu), grads("plan grads", Device::cpu),
      gathered("plan gathered", Device::cpu), optim("plan optim", Device::cpu);
  Zero3Parameters sharded(units, comm, {&params, &grads, &gathered}, 5, 0.05f, true, init);
  AdamW adamw(sharded.trainable(), AdamWConfig{}, optim);
  return {params.stats().in_use_bytes, grads.stats().in_use_bytes, optim.stats().in_use_bytes,
          sharded.largest_unit_bytes(4)};
}

}  // namespace

TEST_CASE("memory plan: the bytes ZeRO-3 and AdamW allocate, before they do", "[plan]") {
  auto comm = make_mpi_world_comm(60);
  const LlamaConfig config = odd_config();
  PlanSettings settings;
  settings.ranks = comm->size();

  SECTION("full training") {
    const std::vector<UnitSpec> units = llama_units(config);
    const MemoryPlan plan = plan_memory(units, settings);
    const Measured m = allocate(units, *comm, {});
    CHECK(plan.params == m.params);
    CHECK(plan.grads == m.grads);
    CHECK(plan.optimizer == m.optimizer);
    CHECK(plan.gathered == 2 * m.gathered_per_unit);
    CHECK(plan.host == plan.params + plan.grads + plan.optimizer + plan.gathered);
    CHECK(plan.device == 0);
  }
  SECTION("an asynchronous save's staging: the master and the moments in fp32") {
    const std::vector<UnitSpec> units = llama_units(config);
    settings.checkpoint_staging = true;
    const MemoryPlan plan = plan_memory(units, settings);
    Arena params("plan params", Device::cpu), grads("plan grads", Device::cpu),
        gathered("plan gathered", Device::cpu), optim("plan optim", Device::cpu);
    Zero3Parameters sharded(units, *comm, {&params, &grads, &gathered}, 5, 0.05f, true, {});
    AdamW adamw(sharded.trainable(), AdamWConfig{}, optim);
    Zero3State weights(sharded);
    const std::vector<CheckpointManager::Part> parts = {{"weights", &weights}, {"optim", &adamw}};
    CHECK(plan.checkpoint_staging == CheckpointManager::state_bytes(parts, comm->rank()));
    CHECK(plan.host == plan.params + plan.grads + plan.optimizer + plan.gathered);
    // bf16 state is staged widened: the same bytes as fp32's.
    settings.state = StateDType::bf16;
    CHECK(plan_memory(units, settings).checkpoint_staging == plan.checkpoint_staging);
  }
  SECTION("GaLore: projected moments and projectors, AdamW's moments for the rest") {
    const std::vector<UnitSpec> units = llama_units(config);
    settings.galore = GaloreConfig();
    settings.galore->projector.rank = 24;  // below the k, v projections' 64 rows
    const MemoryPlan plan = plan_memory(units, settings);
    Arena params("plan params", Device::cpu), grads("plan grads", Device::cpu),
        gathered("plan gathered", Device::cpu), optim("plan optim", Device::cpu);
    Zero3Parameters sharded(units, *comm, {&params, &grads, &gathered}, 5, 0.05f, true, {});
    GaloreConfig galore;
    galore.projector.rank = 24;
    GaloreAdamW optimizer(sharded.trainable(), AdamWConfig{}, galore, optim);
    CHECK(plan.optimizer == optim.stats().in_use_bytes);
    CHECK(plan.optimizer == optimizer.state_bytes().total());
    // Its temporaries (optim/galore_memory.h: tested against the optimizer's own peak in
    // test_galore_memory) come on top, where the gradients are; their float64 host copies on the
    // host.
    CHECK(plan.galore_working > 0);
    CHECK(plan.galore_host > 0);
    CHECK(plan.host == plan.params + plan.grads + plan.optimizer + plan.gathered +
                           plan.galore_working + plan.galore_host);
    PlanSettings gpu = settings;
    gpu.gpu = true;
    const MemoryPlan on_gpu = plan_memory(units, gpu);
    CHECK(on_gpu.host == on_gpu.galore_host);
    CHECK(on_gpu.device == on_gpu.params + on_gpu.grads + on_gpu.optimizer + on_gpu.copies +
                               on_gpu.gathered + on_gpu.galore_working);
    gpu.offload = Offload::optimizer;
    const MemoryPlan offloaded = plan_memory(units, gpu);
    CHECK(offloaded.host == offloaded.params + offloaded.grads + offloaded.optimizer +
                                offloaded.galore_working + offloaded.galore_host);
    // On one rank GaLore's state is below AdamW's. Its replicated parts (the right side's Q,
    // the left side's moments) do not shrink with the ranks, so on many ranks and matrices this
    // small it may not be.
    PlanSettings one_rank;
    const size_t adamw_one = plan_memory(units, one_rank).optimizer;
    one_rank.galore = settings.galore;
    CHECK(plan_memory(units, one_rank).optimizer < adamw_one);
  }
  SECTION("8-bit state: codes and block scales, staged as f32; GaLore's too") {
    const std::vector<UnitSpec> units = llama_units(config);
    settings.state = StateDType::int8;
    settings.checkpoint_staging = true;
    AdamWConfig int8;
    int8.int8_state = true;
    for (const bool galore_on : {false, true}) {
      INFO((galore_on ? "GaLore" : "AdamW"));
      GaloreConfig galore;
      galore.projector.rank = 24;  // gate/up's [192, 24] and down's [24, 192] moments are 8-bit
      if (galore_on) settings.galore = galore;
      const MemoryPlan plan = plan_memory(units, settings);
      Arena params("plan params", Device::cpu), grads("plan grads", Device::cpu),
          gathered("plan gathered", Device::cpu), optim("plan optim", Device::cpu);
      Zero3Parameters sharded(units, *comm, {&params, &grads, &gathered}, 5, 0.05f, true, {});
      std::unique_ptr<Optimizer> optimizer;
      if (galore_on)
        optimizer = std::make_unique<GaloreAdamW>(sharded.trainable(), int8, galore, optim);
      else
        optimizer = std::make_unique<AdamW>(sharded.trainable(), int8, optim);
      CHECK(plan.optimizer == optim.stats().in_use_bytes);
      Zero3State weights(sharded);
      const std::vector<CheckpointManager::Part> parts = {{"weights", &weights},
                                                          {"optim", optimizer.get()}};
      // (The plan stages GaLore's replicated tensors on every rank, a save on rank 0 only.)
      if (!galore_on || comm->rank() == 0)
        CHECK(plan.checkpoint_staging == CheckpointManager::state_bytes(parts, comm->rank()));
      // Less than the fp32 state, more than a quarter of it (the block scales, fp32 vectors).
      PlanSettings fp32 = settings;
      fp32.state = StateDType::fp32;
      const size_t full = plan_memory(units, fp32).optimizer;
      CHECK(plan.optimizer < full);
      if (!galore_on) CHECK(plan.optimizer > full / 4);
    }
  }
  SECTION("LoRA: a frozen fp32 base, adapters with gradients and moments") {
    LoraConfig lora;
    lora.rank = 4;
    lora.targets = lora_targets_from_names("all");
    const std::vector<UnitSpec> units = lora_units(config, lora);
    const MemoryPlan plan = plan_memory(units, settings);
    const Measured m = allocate(units, *comm, {});
    CHECK(plan.params == m.params);
    CHECK(plan.grads == m.grads);
    CHECK(plan.optimizer == m.optimizer);
  }
  SECTION("QLoRA and HQQ-LoRA: the 4-bit base counted by its codes and block scales") {
    LoraConfig lora;
    lora.rank = 4;
    lora.targets = lora_targets_from_names("all");
    const std::vector<UnitSpec> units = lora_units(config, lora);
    const auto projection = [](const ParamSpec& p) {
      return p.shape.size() == 2 && is_block_projection(p.name);
    };
    for (const bool hqq : {false, true}) {
      INFO((hqq ? "HQQ" : "NF4"));
      Zero3Init init;
      (hqq ? init.hqq : init.nf4) = projection;
      settings.four_bit = projection;
      settings.four_bit_hqq = hqq;
      const MemoryPlan plan = plan_memory(units, settings);
      const Measured m = allocate(units, *comm, init);
      CHECK(plan.params == m.params);
      CHECK(plan.grads == m.grads);
      CHECK(plan.optimizer == m.optimizer);
    }
  }
}

TEST_CASE("memory plan: where the state lands on a GPU", "[plan]") {
  const std::vector<UnitSpec> units = llama_units(odd_config());
  PlanSettings gpu;
  gpu.gpu = true;
  const MemoryPlan none = plan_memory(units, gpu);
  CHECK(none.host == 0);
  CHECK(none.device == none.params + none.grads + none.optimizer + none.copies + none.gathered);
  CHECK(none.copies * 2 == none.params);  // bf16 copies of fp32 masters
  gpu.offload = Offload::optimizer;
  const MemoryPlan optimizer = plan_memory(units, gpu);
  CHECK(optimizer.host == none.params + none.grads + none.optimizer);
  CHECK(optimizer.device == none.copies + none.gathered);
  gpu.offload = Offload::params;
  const MemoryPlan params = plan_memory(units, gpu);
  CHECK(params.host == none.params + none.grads + none.optimizer + none.copies);
  CHECK(params.device == none.gathered);
  gpu.offload = Offload::none;
  gpu.state = StateDType::bf16;
  const MemoryPlan bf16 = plan_memory(units, gpu);
  CHECK(bf16.params * 2 == none.params);
  CHECK(bf16.copies == 0);  // a bf16 master is its own copy
}

TEST_CASE("memory plan: one rank keeps its FP8 weight codes for the step", "[plan]") {
  const std::vector<UnitSpec> units = llama_units(odd_config());
  // odd_config's projections by shape: q, o [128, 128]; k, v [64, 128] (2 KV heads of 32);
  // gate, up [192, 128]; down [128, 192]; 3 blocks. One byte a weight.
  const size_t q = 128 * 128, kv = 64 * 128, mlp = 192 * 128;
  TrainConfig c;
  c.fp8.enabled = true;
  PlanSettings gpu;
  gpu.gpu = true;
  const MemoryPlan bf16 = plan_memory(units, gpu);
  gpu.fp8_gathered = fp8_gathered_weights(c, 1, true);
  const MemoryPlan fp8 = plan_memory(units, gpu);
  CHECK(fp8.fp8_codes == 3 * (2 * q + 2 * kv + 3 * mlp));
  CHECK(fp8.device == bf16.device + fp8.fp8_codes);
  c.fp8.linears = "q_proj,down_proj";
  gpu.fp8_gathered = fp8_gathered_weights(c, 1, true);
  CHECK(plan_memory(units, gpu).fp8_codes == 3 * (q + mlp));
  // On two ranks each gather moves the codes: none kept.
  gpu.ranks = 2;
  gpu.fp8_gathered = fp8_gathered_weights(c, 2, true);
  CHECK(plan_memory(units, gpu).fp8_codes == 0);
  // No FP8 weight gathers: under current scaling, or with LoRA's frozen base.
  c.fp8.recipe = Fp8Recipe::current;
  CHECK(!fp8_gathered_weights(c, 1, true));
  c.fp8.recipe = Fp8Recipe::delayed;
  c.train.type = TrainType::lora;
  CHECK(!fp8_gathered_weights(c, 1, true));
}
