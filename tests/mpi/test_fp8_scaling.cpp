// FP8 delayed scaling across ranks: each rank casts different data into the same tensor's slot
// (data-parallel ranks reading different sequences); after end_step with the communicator's
// max, every rank holds the same scale, max / amax over all ranks' data (checked against the
// ranks' amaxes gathered and maxed in float64), and the history rolls on each rank alike. And
// FP8 weight gathers (Fp8Encoding): each rank encodes its rows into one byte per weight; the
// gathered, decoded weight equals the whole tensor cast on one rank, directly and through
// ZeRO-3 (Zero3Init::encoding, a LoRA base).
#include <algorithm>
#include <cmath>
#include <vector>

#include "catch_compat.h"
#include "core/random.h"
#include "model/fp8_scaling.h"
#include "model/local_parameters.h"
#include "model/lora.h"
#include "ops/fp8.h"
#include "parallel/comm.h"
#include "parallel/fp8_encoding.h"
#include "parallel/zero3_parameters.h"

using namespace frugal;

namespace {

// Rank r's activations: uniform in +-(1 + r) * 0.7, so the largest rank decides the amax.
Tensor rank_data(int rank, int64_t rows, int64_t cols, uint64_t seed) {
  Tensor x = Tensor::empty({rows, cols});
  uint64_t state = seed * 1000 + uint64_t(rank);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = float((2 * uniform01(state) - 1) * (1 + rank) * 0.7);
  return x;
}

double local_amax(const Tensor& x) {
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) m = std::max(m, std::fabs(double(x.data<float>()[i])));
  return m;
}

}  // namespace

TEST_CASE("fp8 delayed scaling: the amax is reduced over the ranks that share the tensor",
          "[fp8]") {
  auto comm = make_mpi_world_comm(60);
  Fp8Settings settings;
  settings.enabled = true;
  settings.recipe = Fp8Recipe::delayed;
  settings.amax_history_len = 2;
  settings.margin = 1;
  settings.linears = {kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj};
  Fp8Scaling scaling(settings, /*layers=*/2, host_arena());
  const auto reduce = [&](Tensor& amax) { comm->all_reduce_max(amax)->wait(); };

  std::vector<double> global_amax_by_step;
  for (uint64_t step = 1; step <= 3; ++step) {
    // Layer 1's gate input; step 3 casts smaller values, so the history's older max stays.
    const double shrink = step == 3 ? 0.25 : 1.0;
    Tensor x = rank_data(comm->rank(), 48, 32, step);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= float(shrink);
    ops::fp8_cast(x, scaling.input(1, kGateProj), true, false);
    // What every rank's amax was, independently: all-gathered, max in float64.
    Tensor mine = Tensor::empty({1}, DType::f64);
    mine.data<double>()[0] = local_amax(x);
    Tensor all = Tensor::empty({comm->size()}, DType::f64);
    comm->all_gather(mine, all)->wait();
    global_amax_by_step.push_back(
        *std::max_element(all.data<double>(), all.data<double>() + comm->size()));

    scaling.end_step(reduce);
    // The window of 2: this step's and the last one's.
    const size_t n = global_amax_by_step.size();
    const double amax =
        std::max(global_amax_by_step[n - 1], n > 1 ? global_amax_by_step[n - 2] : 0);
    const float want = std::ldexp(448.0f / float(amax), -1);
    const ops::Fp8Slot slot = scaling.input(1, kGateProj);
    CHECK(slot.scale.data<float>()[0] == want);
    CHECK(slot.scale_inv.data<float>()[0] == 1.0f / want);
    CHECK(slot.amax.data<float>()[0] == 0.0f);  // cleared for the next step
    // The same on every rank.
    CHECK(comm->all_reduce_sum(double(want)) == comm->size() * double(want));
    // A slot nothing was cast into keeps its scale of 1.
    CHECK(scaling.weight(0, kQProj).scale.data<float>()[0] == 1.0f);
  }
  // The counts saw every rank's own values.
  const std::vector<Fp8Scaling::Counts> counts = scaling.take_counts();
  int64_t values = 0;
  for (const auto& c : counts)
    if (c.layer == 1 && c.role == Fp8Role::activation) values = c.values;
  CHECK(values == 3 * 48 * 32);
  for (const auto& c : scaling.take_counts()) CHECK(c.values == 0);  // taken means zeroed
}

namespace {

// The whole tensor cast on one rank, as current scaling casts it, and decoded.
std::vector<float> cast_whole(const Tensor& w) {
  ops::Fp8Slot slot;
  slot.format = ops::Fp8Format::e4m3;
  slot.scale = Tensor::zeros({1});
  slot.scale.data<float>()[0] = 1.0f;
  slot.scale_inv = Tensor::zeros({1});
  slot.amax = Tensor::zeros({1});
  slot.counts = Tensor::zeros({3}, DType::i64);
  slot.current = true;
  const ops::Fp8Cast cast =
      ops::fp8_cast(w.view({w.size(0), w.numel() / w.size(0)}), slot, true, false);
  Tensor out = Tensor::empty({w.numel()});
  ops::dequantize_fp8(out, cast.plain.codes.view({w.numel()}), slot.scale_inv, slot.format);
  return {out.data<float>(), out.data<float>() + out.numel()};
}

}  // namespace

TEST_CASE("fp8 weight gathers: the gathered weight equals the whole tensor cast on one rank",
          "[fp8][zero3]") {
  auto comm = make_mpi_world_comm(60);
  const int ranks = comm->size();
  // 37 rows: shards of uneven length, padding on the last rank.
  const ParamSpec spec{"model.layers.0.mlp.up_proj.weight", {37, 48}, false};
  Tensor whole = Tensor::empty(spec.shape);
  uint64_t state = 17;
  for (int64_t i = 0; i < whole.numel(); ++i)
    whole.data<float>()[i] = float((2 * uniform01(state) - 1) * std::ldexp(1.0, int(i % 23) - 16));
  const ShardLayout l = shard_layout(spec, ranks);
  Tensor rows = Tensor::zeros(l.shard_shape());
  const int64_t first = l.first_row(comm->rank()), last = l.last_row(comm->rank());
  if (last > first) rows.rows(0, last - first).copy_from(whole.rows(first, last));

  Arena store("fp8 store", Device::cpu);
  Fp8Encoding encoding;
  encoding.encode(l, rows, {*comm, host_arena(), store});
  const std::vector<EncodedPart> parts = encoding.parts();
  REQUIRE(parts.size() == 2);
  // One byte per weight on this rank (bf16 would be two), and a 4-byte scale.
  CHECK(parts[0].data.bytes() == size_t(l.shard_rows * l.row_len));
  CHECK(parts[1].data.bytes() == 4);
  CHECK(parts[1].split == PartSplit::replicated);
  Tensor gathered = Tensor::empty({parts[0].data.numel() * ranks}, DType::u8);
  comm->all_gather(parts[0].data, gathered)->wait();
  Tensor decoded = Tensor::empty(spec.shape);
  encoding.decode({gathered, parts[1].data}, decoded);
  const std::vector<float> want = cast_whole(whole);
  CHECK(std::equal(want.begin(), want.end(), decoded.data<float>()));
}

TEST_CASE("fp8 weight gathers through ZeRO-3: a LoRA base stored and gathered as FP8",
          "[fp8][zero3]") {
  auto comm = make_mpi_world_comm(60);
  LlamaConfig config;
  config.hidden_size = 48;
  config.intermediate_size = 80;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 3;
  config.num_key_value_heads = 1;
  config.vocab_size = 37;
  config.max_position_embeddings = 32;
  LoraConfig lora;
  lora.rank = 4;
  lora.targets = lora_targets_from_names("all");
  const std::vector<UnitSpec> units = lora_units(config, lora);
  LocalParameters whole(units, 5, 0.05f, true);
  Arena params("p", Device::cpu), grads("g", Device::cpu), gathered("w", Device::cpu);
  Zero3Init init;
  init.encoding = [](const ParamSpec& p) -> std::unique_ptr<WeightEncoding> {
    if (p.shape.size() == 2 && is_block_projection(p.name)) return std::make_unique<Fp8Encoding>();
    return nullptr;
  };
  Zero3Parameters sharded(units, *comm, {&params, &grads, &gathered}, 5, 0.05f, true, init);
  const int64_t unit = 2;  // layers.1
  CHECK(sharded.is_quantized(unit, kDownProj));
  std::vector<Tensor> got = sharded.gather(unit);
  for (int p : {kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj}) {
    INFO("projection " << p);
    const std::vector<float> want = cast_whole(whole.param(units[unit].params[size_t(p)].name));
    CHECK(std::equal(want.begin(), want.end(), got[size_t(p)].data<float>()));
  }
  // The norms are not encoded: as initialised.
  const Tensor& norm = whole.param(units[unit].params[kInputNorm].name);
  CHECK(std::equal(norm.data<float>(), norm.data<float>() + norm.numel(),
                   got[kInputNorm].data<float>()));
  got.clear();
  sharded.release(unit);
}
