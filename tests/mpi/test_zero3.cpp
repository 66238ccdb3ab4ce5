// ZeRO-3 over 1, 2 and 4 MPI ranks equals one rank holding the whole model: the same global
// batch, seed and steps give the same losses and the same final weights (fp32 tolerance),
// with sizes that need padding (vocab 37, 3 heads over 1 kv head). And the per-rank memory
// is what the layout promises: total / N plus padding, and at most two whole units.
#include <algorithm>
#include <cmath>
#include <random>

#include "catch_compat.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model/lora.h"
#include "model_support.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "parallel/nf4_encoding.h"
#include "parallel/zero3_parameters.h"
#include "quant/hqq.h"
#include "quant/nf4.h"
#include "train/train_step.h"

using namespace frugal;

namespace {

LlamaConfig odd_config(bool tied) {
  LlamaConfig c;
  c.hidden_size = 48;
  c.intermediate_size = 70;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.vocab_size = 37;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  return c;
}

// The global batch: at least 4 sequences, split evenly over the ranks (3 ranks: 6; 8 ranks: 8).
int64_t global_batch(int ranks) { return ranks * ((4 + ranks - 1) / ranks); }

// Sequences [first, first + count) of the step's global batch of `global` sequences of 13 tokens.
Batch slice_of_global_batch(int64_t first, int64_t count, int64_t step, int64_t micro,
                            int64_t global) {
  return test::slice_of_random_batch(uint32_t(1000 * step + micro), global, 13, 37, first, count,
                                     7);
}

void check_equivalence(bool tied, CheckpointPolicy policy) {
  auto comm = make_mpi_world_comm(60);
  const int rank = comm->rank(), ranks = comm->size();
  const int64_t global = global_batch(ranks);
  REQUIRE(global % ranks == 0);
  const LlamaConfig config = odd_config(tied);
  LlamaModel model(config);
  // eps well above the rounding noise of near-zero gradients, which Adam would otherwise
  // normalise into full-size steps of either sign.
  const AdamWConfig adamw{0.9, 0.95, 1e-6, 0.1, 0.5};

  // The reference: one rank, whole model, whole batch (computed on every rank alike).
  LocalParameters whole(config, 5, 0.05f, true);
  AdamW whole_opt(whole.trainable(), adamw);

  Arena params_arena("test params", Device::cpu), grads_arena("test grads", Device::cpu),
      gathered_arena("test gathered", Device::cpu), optim_arena("test optim", Device::cpu);
  Zero3Parameters sharded(llama_units(config), *comm,
                          {&params_arena, &grads_arena, &gathered_arena}, 5, 0.05f);
  AdamW sharded_opt(sharded.trainable(), adamw, optim_arena);

  const int64_t per_rank = global / ranks;
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<Batch> whole_batches, rank_batches;
    for (int64_t micro = 0; micro < 2; ++micro) {
      whole_batches.push_back(slice_of_global_batch(0, global, step, micro, global));
      rank_batches.push_back(slice_of_global_batch(rank * per_rank, per_rank, step, micro, global));
    }
    const double lr = 1e-3;
    StepResult a = train_step(model, whole, whole_opt, whole_batches, nullptr, lr, step, policy);
    StepResult b =
        train_step(model, sharded, sharded_opt, rank_batches, comm.get(), lr, step, policy);
    INFO("step " << step << " on " << ranks << " ranks");
    CHECK(b.tokens == a.tokens);
    CHECK(b.loss == Approx(a.loss).epsilon(1e-5));
    CHECK(b.grad_norm == Approx(a.grad_norm).epsilon(1e-4));
  }

  // Final weights: gather every unit (a collective) and compare with the whole model.
  const std::vector<UnitSpec> units = llama_units(config);
  std::string worst;
  const double difference = test::max_weight_difference(sharded, whole, units, &worst);
  INFO("largest weight difference " << difference << " at " << worst);
  CHECK(difference < 1e-5);

  // Memory: the parameter shards are ceil(rows / N) rows of each tensor, computed here from
  // the config alone; gradients and optimizer state likewise (two moments).
  size_t expected_shard_bytes = 0, largest_unit = 0, second_unit = 0;
  for (const UnitSpec& unit : units) {
    size_t unit_bytes = 0;
    for (const ParamSpec& p : unit.params) {
      const int64_t rows = p.shape[0], row_len = shape_numel(p.shape) / rows;
      expected_shard_bytes += size_t((rows + ranks - 1) / ranks * row_len) * 4;
      unit_bytes += size_t((rows + ranks - 1) / ranks * ranks * row_len) * 4;
    }
    if (unit_bytes > largest_unit) {
      second_unit = largest_unit;
      largest_unit = unit_bytes;
    } else {
      second_unit = std::max(second_unit, unit_bytes);
    }
  }
  CHECK(params_arena.stats().in_use_bytes == expected_shard_bytes);
  CHECK(grads_arena.stats().in_use_bytes == expected_shard_bytes);
  CHECK(optim_arena.stats().in_use_bytes == 2 * expected_shard_bytes);
  // Weights of two units and the gradients of two units, plus reduce-scatter landing
  // buffers (one shard each); with tied embeddings the head also holds the embedding.
  const size_t bound =
      2 * (largest_unit + second_unit) + (tied ? largest_unit : 0) + expected_shard_bytes;
  INFO("gathered peak " << gathered_arena.stats().peak_bytes << " bound " << bound);
  CHECK(gathered_arena.stats().peak_bytes <= bound);
  CHECK(gathered_arena.stats().in_use_bytes == 0);
}

}  // namespace

// LoRA under ZeRO-3: the frozen base is sharded like any weight but gets no gradient and no
// optimizer state; the adapters' trajectory on N ranks equals one rank's.
namespace {

// `steps` AdamW steps of the whole model on one rank (every rank computes it alike) and of the
// sharded one on this rank's slice of the same global batches: the same losses and gradient
// norms at every step, and the same weights at the end.
void expect_same_training(LlamaModel& model, LocalParameters& whole, AdamW& whole_opt,
                          Zero3Parameters& sharded, AdamW& sharded_opt, Comm& comm,
                          const std::vector<UnitSpec>& units, int64_t steps, double lr,
                          CheckpointPolicy policy) {
  const int64_t global = global_batch(comm.size()), per_rank = global / comm.size();
  for (int64_t step = 1; step <= steps; ++step) {
    StepResult a =
        train_step(model, whole, whole_opt, {slice_of_global_batch(0, global, step, 0, global)},
                   nullptr, lr, step, policy);
    StepResult b =
        train_step(model, sharded, sharded_opt,
                   {slice_of_global_batch(comm.rank() * per_rank, per_rank, step, 0, global)},
                   &comm, lr, step, policy);
    INFO("step " << step << " on " << comm.size() << " ranks");
    CHECK(b.loss == Approx(a.loss).epsilon(1e-5));
    CHECK(b.grad_norm == Approx(a.grad_norm).epsilon(1e-4));
  }
  std::string worst;
  const double difference = test::max_weight_difference(sharded, whole, units, &worst);
  INFO("largest weight difference " << difference << " at " << worst);
  CHECK(difference < 1e-5);
}

}  // namespace

TEST_CASE("ZeRO-3 with LoRA adapters equals one rank", "[zero3][lora][mpi]") {
  auto comm = make_mpi_world_comm(60);
  const int ranks = comm->size();
  const LlamaConfig config = odd_config(false);
  LoraConfig lora;
  lora.rank = 3;
  lora.alpha = 6;
  lora.targets = lora_targets_from_names("q_proj,v_proj,down_proj");
  LlamaModel model(config);
  model.set_lora(&lora);
  const AdamWConfig adamw{0.9, 0.95, 1e-6, 0.1, 0.5};
  LocalParameters whole(lora_units(config, lora), 5, 0.05f, true);
  AdamW whole_opt(whole.trainable(), adamw);
  Arena params_arena("test params", Device::cpu), grads_arena("test grads", Device::cpu),
      gathered_arena("test gathered", Device::cpu), optim_arena("test optim", Device::cpu);
  Zero3Parameters sharded(lora_units(config, lora), *comm,
                          {&params_arena, &grads_arena, &gathered_arena}, 5, 0.05f);
  AdamW sharded_opt(sharded.trainable(), adamw, optim_arena);
  REQUIRE(sharded.trainable().size() == 3 * 2 * size_t(config.num_hidden_layers));

  expect_same_training(model, whole, whole_opt, sharded, sharded_opt, *comm,
                       lora_units(config, lora), 4, 1e-2, CheckpointPolicy::selective);
  // Memory: gradients and moments only for the adapters' rows.
  size_t adapter_bytes = 0;
  for (const UnitSpec& u : lora_units(config, lora))
    for (const ParamSpec& p : u.params)
      if (p.trainable)
        adapter_bytes +=
            size_t((p.shape[0] + ranks - 1) / ranks * (shape_numel(p.shape) / p.shape[0])) * 4;
  CHECK(grads_arena.stats().in_use_bytes == adapter_bytes);
  CHECK(optim_arena.stats().in_use_bytes == 2 * adapter_bytes);
}

// QLoRA under ZeRO-3: the frozen projections are stored as NF4 rows, quantized by the ranks
// together exactly as one process quantizes the whole tensor (gate/up have 640 blocks: their
// second-level groups of 256 straddle the ranks' shards), gathered as bytes and dequantized.
// The reference: one rank, whole model, whose projections are replaced by
// nf4_dequantize(nf4_quantize(W)) of the same initialisation.
namespace {

// A delayed-scaling E4M3 slot in host memory whose scale makes the 4-bit base's codes spread
// over the format: scale 64, amax and counts zero.
ops::Fp8Slot fp8_test_slot() {
  ops::Fp8Slot slot;
  slot.format = ops::Fp8Format::e4m3;
  slot.scale = Tensor::zeros({1});
  slot.scale_inv = Tensor::zeros({1});
  slot.amax = Tensor::zeros({1});
  slot.counts = Tensor::zeros({3}, DType::i64);
  slot.scale.data<float>()[0] = 64.0f;
  slot.scale_inv.data<float>()[0] = 1.0f / 64.0f;
  return slot;
}

// How the test picks the base's encoding: Zero3Init::nf4, Zero3Init::hqq, or an Nf4Encoding
// handed out by Zero3Init::encoding (the way any other encoding is picked).
enum class BasePick { nf4, hqq, nf4_by_encoding };

void check_quantized_base(BasePick pick) {
  const bool hqq = pick == BasePick::hqq;
  auto comm = make_mpi_world_comm(60);
  const int ranks = comm->size();
  LlamaConfig config;
  config.hidden_size = 64;
  config.intermediate_size = 640;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.vocab_size = 37;
  config.max_position_embeddings = 32;
  LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.targets = lora_targets_from_names("all");
  LlamaModel model(config);
  model.set_lora(&lora);
  const AdamWConfig adamw{0.9, 0.95, 1e-6, 0.1, 0.5};

  LocalParameters whole(lora_units(config, lora), 5, 0.05f, true);
  int64_t quantized = 0;
  for (const UnitSpec& u : lora_units(config, lora))
    for (const ParamSpec& p : u.params)
      if (!p.trainable && p.shape.size() == 2 && is_block_projection(p.name)) {
        Tensor& w = whole.param(p.name);
        w.copy_from(hqq ? hqq_dequantize(hqq_quantize(w, p.name))
                        : nf4_dequantize(nf4_quantize(w, p.name)));
        ++quantized;
      }
  REQUIRE(quantized == 7 * config.num_hidden_layers);
  AdamW whole_opt(whole.trainable(), adamw);

  Arena params_arena("test params", Device::cpu), grads_arena("test grads", Device::cpu),
      gathered_arena("test gathered", Device::cpu), optim_arena("test optim", Device::cpu);
  Zero3Init init;
  const auto projection = [](const ParamSpec& p) {
    return p.shape.size() == 2 && is_block_projection(p.name);
  };
  if (pick == BasePick::nf4_by_encoding)
    init.encoding = [&](const ParamSpec& p) -> std::unique_ptr<WeightEncoding> {
      return projection(p) ? std::make_unique<Nf4Encoding>() : nullptr;
    };
  else
    (hqq ? init.hqq : init.nf4) = projection;
  Zero3Parameters sharded(lora_units(config, lora), *comm,
                          {&params_arena, &grads_arena, &gathered_arena}, 5, 0.05f, true, init);
  AdamW sharded_opt(sharded.trainable(), adamw, optim_arena);
  CHECK(sharded.is_quantized(block_unit(0), kGateProj));
  CHECK_FALSE(sharded.is_quantized(embed_unit(), 0));

  // Adam turns the summation-order differences of near-zero gradient entries (A's are tiny
  // while B is still near 0) into steps of up to lr: the weight bound scales with it.
  expect_same_training(model, whole, whole_opt, sharded, sharded_opt, *comm,
                       lora_units(config, lora), 3, 1e-3, CheckpointPolicy::none);
  // The frozen projections cost their NF4 bytes on this rank: half a byte per weight plus a
  // byte per 64 weights, and the second-level scales, not 4 bytes per weight.
  size_t fp32_bytes = 0, nf4_bytes = 0;
  for (const UnitSpec& u : lora_units(config, lora))
    for (const ParamSpec& p : u.params) {
      const int64_t rows = (p.shape[0] + ranks - 1) / ranks,
                    row_len = shape_numel(p.shape) / p.shape[0];
      if (!p.trainable && p.shape.size() == 2 && is_block_projection(p.name))
        nf4_bytes += hqq ? size_t(rows * row_len / 2 + rows * row_len / 64 * 8)  // scale, zero
                         : size_t(rows * row_len / 2 + rows * row_len / 64) +
                               size_t((shape_numel(p.shape) / 64 + 255) / 256) * 4;
      else
        fp32_bytes += size_t(rows * row_len) * 4;
    }
  CHECK(params_arena.stats().in_use_bytes == fp32_bytes + nf4_bytes);

  // What training gathers (gather_compressed) holds no dequantized projection: each is made
  // when used, one matrix at a time in the gathered memory, equal to what gather makes.
  const int64_t unit = block_unit(1);
  std::vector<Tensor> eager = sharded.gather(unit);
  std::vector<std::vector<float>> expected;
  for (const Tensor& w : eager) expected.emplace_back(w.data<float>(), w.data<float>() + w.numel());
  eager.clear();
  sharded.release(unit);
  const size_t before = gathered_arena.stats().in_use_bytes;
  std::vector<Tensor> lazy = sharded.gather_compressed(unit);
  const size_t bytes_gathered = gathered_arena.stats().in_use_bytes;  // the 4-bit rows (ranks > 1)
  CHECK(lazy[kInputNorm].defined());
  for (int p : {kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj}) {
    INFO("projection " << p);
    CHECK_FALSE(lazy[p].defined());
    {
      const Tensor w = sharded.materialize(unit, size_t(p));
      const ParamSpec spec = lora_units(config, lora)[size_t(unit)].params[size_t(p)];
      CHECK(w.shape() == spec.shape);
      const size_t padded_rows = size_t((spec.shape[0] + ranks - 1) / ranks * ranks);
      CHECK(gathered_arena.stats().in_use_bytes - bytes_gathered ==
            padded_rows * size_t(spec.shape[1]) * 4);
      CHECK(std::equal(expected[size_t(p)].begin(), expected[size_t(p)].end(), w.data<float>()));
    }
    CHECK(gathered_arena.stats().in_use_bytes == bytes_gathered);
    // FP8 training reads the base as E4M3 codes decoded straight from the 4 bits (HQQ, NF4):
    // those of the cast of the materialized weight, in either orientation, with the same amax
    // and counts.
    for (bool transposed : {false, true}) {
      INFO("fp8, transposed " << transposed);
      const ops::Fp8Slot direct = fp8_test_slot(), two_pass = fp8_test_slot();
      const std::optional<ops::Fp8Matrix> codes =
          sharded.fp8_weight(unit, size_t(p), direct, transposed);
      REQUIRE(codes);
      const ops::Fp8Cast cast =
          ops::fp8_cast(sharded.materialize(unit, size_t(p)), two_pass, !transposed, transposed);
      const Tensor& want = transposed ? cast.transposed.codes : cast.plain.codes;
      CHECK(codes->codes.shape() == want.shape());
      CHECK(std::equal(want.data<uint8_t>(), want.data<uint8_t>() + want.numel(),
                       codes->codes.data<uint8_t>()));
      CHECK(codes->scale_inv.data<float>()[0] == direct.scale_inv.data<float>()[0]);
      CHECK(direct.amax.data<float>()[0] == two_pass.amax.data<float>()[0]);
      CHECK(direct.amax.data<float>()[0] > 0.0f);
      for (int k = 0; k < 3; ++k)
        CHECK(direct.counts.data<int64_t>()[k] == two_pass.counts.data<int64_t>()[k]);
    }
  }
  lazy.clear();
  sharded.release(unit);
  CHECK(gathered_arena.stats().in_use_bytes == before);
}

}  // namespace

// QLoRA under ZeRO-3 with NF4 (double quantization shared by the ranks) and with HQQ (the
// half-quadratic zero fit, whose early stop the ranks decide together).
TEST_CASE("ZeRO-3 with a 4-bit base (QLoRA) equals one rank on the dequantized base",
          "[zero3][lora][mpi]") {
  SECTION("NF4") { check_quantized_base(BasePick::nf4); }
  SECTION("HQQ") { check_quantized_base(BasePick::hqq); }
  SECTION("NF4 through Zero3Init::encoding") { check_quantized_base(BasePick::nf4_by_encoding); }
}

TEST_CASE("ZeRO-3 equals one rank", "[zero3][mpi]") {
  SECTION("untied, no checkpointing") { check_equivalence(false, CheckpointPolicy::none); }
  SECTION("tied embeddings, selective") { check_equivalence(true, CheckpointPolicy::selective); }
}

// Every rank alone (its gradient shards at hand): zero_grads clears nothing. A unit's first
// grads() under GradSums::kOnce is to be overwritten (the old values are left), any later one
// added into; a first kSeveral one clears the shards then; finish_backward clears the units no
// gradient reached. The training itself is checked by "ZeRO-3 equals one rank" on one rank.
TEST_CASE("ZeRO-3 alone clears gradients only where no first write overwrites them",
          "[zero3][mpi]") {
  auto world = make_mpi_world_comm(60);
  const std::unique_ptr<Comm> alone = world->split(world->rank(), 0);
  REQUIRE(alone->size() == 1);
  const LlamaConfig config = odd_config(false);
  Arena params_arena("test params", Device::cpu), grads_arena("test grads", Device::cpu),
      gathered_arena("test gathered", Device::cpu);
  Zero3Parameters params(llama_units(config), *alone,
                         {&params_arena, &grads_arena, &gathered_arena}, 5, 0.05f);
  // The last step's gradients: all ones.
  const auto fill_ones = [&] {
    for (TrainableShard& s : params.trainable())
      std::fill_n(s.grad.data<float>(), s.grad.numel(), 1.0f);
  };
  const auto all_equal = [](const std::vector<Tensor>& unit, float value) {
    for (const Tensor& g : unit)
      for (int64_t i = 0; i < g.numel(); ++i)
        if (g.data<float>()[i] != value) return false;
    return true;
  };
  fill_ones();
  params.zero_grads();
  const UnitGrads first = params.grads(block_unit(0), GradSums::kOnce);
  CHECK(first.write == GradWrite::kOverwrite);
  CHECK(all_equal(first.tensors, 1.0f));  // left for the backward to overwrite
  params.grads_done(block_unit(0));
  CHECK(params.grads(block_unit(0), GradSums::kOnce).write == GradWrite::kAdd);
  params.grads_done(block_unit(0));
  const UnitGrads head = params.grads(head_unit(config), GradSums::kSeveral);
  CHECK(head.write == GradWrite::kAdd);
  CHECK(all_equal(head.tensors, 0.0f));  // cleared for its several adds
  params.grads_done(head_unit(config));
  params.finish_backward();
  for (int64_t unit : {embed_unit(), block_unit(1), block_unit(2)}) {
    INFO("unit " << unit << ", which got no gradient");
    CHECK(all_equal(params.grads(unit, GradSums::kSeveral).tensors, 0.0f));
    params.grads_done(unit);
  }
  CHECK(all_equal(params.grads(block_unit(0), GradSums::kOnce).tensors, 1.0f));
  params.grads_done(block_unit(0));
  // The next step starts over.
  params.zero_grads();
  CHECK(params.grads(block_unit(0), GradSums::kOnce).write == GradWrite::kOverwrite);
  params.grads_done(block_unit(0));
  params.finish_backward();
}

TEST_CASE("shard layout pads rows to a multiple of the ranks", "[zero3]") {
  ShardLayout l = shard_layout({"w", {37, 48}}, 4);
  CHECK(l.shard_rows == 10);
  CHECK(l.rows_padded == 40);
  CHECK(l.first_row(3) == 30);
  CHECK(l.last_row(3) == 37);
  ShardLayout v = shard_layout({"norm", {5}}, 4);
  CHECK(v.shard_rows == 2);
  CHECK(v.row_len == 1);
  CHECK(v.first_row(3) == 5);
  CHECK(v.last_row(3) == 5);  // the last rank holds only padding
}
