// Exact normalization of a masked loss: the loss and its gradient are the mean over the trained
// targets of the whole global batch, whatever its split into data-parallel ranks (flat ZeRO-3
// and hybrid replicas), context-parallel ranks and gradient-accumulation steps. One global batch
// whose masks are as uneven as fine-tuning data makes them (rows with every target trained, with
// a completion only, with none; a micro-batch with one trained target; a quarter whose targets
// all lie on one cp rank) is trained on every split this rank count allows (1, 2, 4 ranks x 1, 2,
// 4 accumulation steps x cp 1, 2; 3 and 8 ranks as far as 48 rows divide) and compared, step
// by step, with one rank training the whole batch as one micro-batch, whose loss is checked in
// turn against a float64 mean computed here from the model's logits: every weight with AdamW
// on every split, LoRA adapters and GaLore on the splits of 4 accumulation steps. And a global
// batch with nothing to train is an error naming the step, which changes nothing.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model/lora.h"
#include "model_support.h"
#include "optim/adamw.h"
#include "optim/galore_adamw.h"
#include "parallel/mesh.h"
#include "parallel/ring_attention.h"
#include "parallel/zero3_parameters.h"
#include "test_support.h"
#include "train/train_step.h"

using namespace frugal;

namespace {

constexpr int64_t kRows = 48, kSeq = 13, kVocab = 29, kSteps = 3;
constexpr int64_t kQuarter = kRows / 4;  // a micro-batch at 4 accumulation steps
constexpr double kLr = 2e-3;
constexpr float kInitStd = 0.2f;

// Tolerances of fp32 reduction order. Every split computes the same per-token terms; what
// changes is the order in which fp32 sums add them: a weight's gradient is a sum over the
// T = 624 positions of the global batch, accumulated across micro-batches and summed across
// ranks (reduce-scatter, replicas) instead of inside one GEMM. Two orders of such a sum differ
// by about sqrt(T) u sum|terms| (u = 2^-24: 1.5e-6 relative; T u = 4e-5 at worst), so:
// - the gradient norm, dominated by elements that do not cancel: 1e-4 relative (as
//   test_zero3 and test_hsdp allow);
// - the loss: per-token losses from fp32 logits, summed in float64; the first step's are the
//   same numbers in another order (1e-15), later ones differ through the weights: 1e-5;
// - AdamW moves a weight by lr m / (sqrt(v) + eps) per step; a change dg of its gradient moves
//   that by lr |dg| / (|g| + eps): lr times ~1e-6 where the gradient does not cancel, more
//   where it nearly does (up to lr |dg| / eps). Measured over every split and variant here:
//   at most 2.3e-7 after 3 steps at lr 2e-3; the bound is 1e-5, 40 times that.
// A wrong normalization reweights whole micro-batches, ranks or cp halves: the losses move by
// 1e-3 relative or more (required of the data below: kDiscrimination; 8e-3 to 0.1 here) and
// the weights by 2e-4 (a factor 2 on the gradient) to 1e-2 (a mean per micro-batch).
constexpr double kLossTolerance = 1e-5, kNormTolerance = 1e-4, kWeightTolerance = 1e-5;
// A mean over the wrong groups must differ from the true one by this many loss tolerances at
// least, or the masks are too even for this test to tell them apart.
constexpr double kDiscrimination = 100;

LlamaConfig tiny_config() {
  LlamaConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.vocab_size = kVocab;
  c.max_position_embeddings = 32;
  return c;
}

// Whether target p of row r of the global batch is trained. The rows' quarters are the
// micro-batches at 4 accumulation steps (halves at 2), and within each, consecutive rows go to
// the dp ranks. At cp = 2 a sequence of 13 targets is padded to 16, in chunks of 4: cp rank 0
// holds positions 0-3 and 12, cp rank 1 positions 4-11.
bool trained(int64_t r, int64_t p) {
  const int64_t i = r % kQuarter;
  switch (r / kQuarter) {
    case 0:  // prompt and completion: every target, or the last i + 1 (a completion)
      return i % 2 == 0 || p >= kSeq - 1 - i;
    case 1:  // 1 to 8 targets in the middle: cp rank 0 has none of this quarter
      return p >= 4 && p < 4 + 1 + i % 8;
    case 2:  // no target, one, or the last 7
      return i % 3 == 1 ? p == i : i % 3 == 2 && p >= 6;
    default:  // one target in the whole quarter (one row, one dp rank, cp rank 0)
      return i == 5 && p == kSeq - 1;
  }
}

// The step's global batch: random tokens; targets mostly one frequent token in the first
// quarter (learnt in a few steps) and uniform elsewhere, so that the groups' losses drift apart.
struct GlobalBatch {
  std::vector<int32_t> tokens, targets;  // [kRows * kSeq], targets -1 where not trained
  int64_t trained_targets = 0;
};

GlobalBatch global_batch(int64_t step, bool mask_all = false) {
  std::mt19937 rng(uint32_t(4242 + step));
  GlobalBatch g;
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t p = 0; p < kSeq; ++p) {
      g.tokens.push_back(int32_t(rng() % kVocab));
      const bool frequent = r < kQuarter && rng() % 4 != 0;
      const int32_t target = frequent ? 3 : int32_t(rng() % kVocab);
      const bool counted = !mask_all && trained(r, p);
      g.targets.push_back(counted ? target : -1);
      g.trained_targets += counted;
    }
  return g;
}

// Rows [first, first + count) of the global batch.
Batch rows_of(const GlobalBatch& g, int64_t first, int64_t count) {
  Batch b;
  b.batch = count;
  b.seq = kSeq;
  b.tokens = Tensor::empty({count * kSeq}, DType::i32);
  b.targets = Tensor::empty({count * kSeq}, DType::i32);
  std::copy_n(g.tokens.begin() + first * kSeq, count * kSeq, b.tokens.data<int32_t>());
  std::copy_n(g.targets.begin() + first * kSeq, count * kSeq, b.targets.data<int32_t>());
  b.positions = sequence_positions(count, kSeq);
  return b;
}

// A split of the global batch: micro-batch m holds rows [m kRows / accum, ...), dp rank d its
// d-th part of them, cp rank c its zigzag share of each row.
struct Split {
  int64_t accum = 1, dp = 1, cp = 1;
  int64_t dp_shard = 0;  // hybrid sharding: dp_shard ranks per replica; 0: one replica
  int64_t rows_per_rank() const { return kRows / (accum * dp); }
  std::string describe() const {
    return "accum " + std::to_string(accum) + " x dp " + std::to_string(dp) +
           (dp_shard > 0 ? " (" + std::to_string(dp / dp_shard) + " replicas)" : "") + " x cp " +
           std::to_string(cp);
  }
};

std::vector<Batch> local_micro_batches(const GlobalBatch& g, const Split& s, const Mesh& mesh) {
  std::vector<Batch> micro;
  for (int64_t m = 0; m < s.accum; ++m) {
    const int64_t first = m * (kRows / s.accum) + mesh.dp_rank * s.rows_per_rank();
    Batch b = rows_of(g, first, s.rows_per_rank());
    if (s.cp > 1) b = context_parallel_slice(b, zigzag_layout(kSeq, mesh.cp_size, mesh.cp_rank));
    micro.push_back(b);
  }
  return micro;
}

// The cp rank holding position p of a sequence under the zigzag layout (2 cp chunks per rank).
int64_t cp_rank_of(int64_t p, int64_t cp) {
  const int64_t chunk_len = (kSeq + 2 * cp - 1) / (2 * cp);
  const int64_t chunk = p / chunk_len;
  return chunk < cp ? chunk : 2 * cp - 1 - chunk;
}

// Every token's loss in float64 from the model's fp32 logits (NaN where not trained).
std::vector<double> token_losses_f64(LlamaModel& model, ParameterProvider& params,
                                     const GlobalBatch& g) {
  const Tensor logits = model.forward_logits(rows_of(g, 0, kRows), params);
  REQUIRE(logits.size(0) == kRows * kSeq);
  REQUIRE(logits.size(1) == kVocab);
  std::vector<double> losses(g.targets.size(), std::nan(""));
  for (size_t t = 0; t < g.targets.size(); ++t) {
    if (g.targets[t] < 0) continue;
    const float* row = logits.data<float>() + t * kVocab;
    double largest = row[0];
    for (int64_t v = 1; v < kVocab; ++v) largest = std::max(largest, double(row[v]));
    double sum = 0;
    for (int64_t v = 0; v < kVocab; ++v) sum += std::exp(double(row[v]) - largest);
    losses[t] = largest + std::log(sum) - double(row[g.targets[t]]);
  }
  return losses;
}

// The mean of the groups' own means (groups without a trained target left out): what a loss
// averaged per micro-batch, per rank or per cp rank would report. One group: the true mean.
double mean_of_group_means(const std::vector<double>& losses, int64_t groups,
                           const std::function<int64_t(int64_t row, int64_t p)>& group_of) {
  std::vector<double> sum(size_t(groups), 0);
  std::vector<int64_t> count(size_t(groups), 0);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t p = 0; p < kSeq; ++p)
      if (!std::isnan(losses[size_t(r * kSeq + p)])) {
        sum[size_t(group_of(r, p))] += losses[size_t(r * kSeq + p)];
        ++count[size_t(group_of(r, p))];
      }
  double total = 0;
  int64_t non_empty = 0;
  for (size_t k = 0; k < sum.size(); ++k)
    if (count[k] > 0) {
      total += sum[k] / double(count[k]);
      ++non_empty;
    }
  return total / double(non_empty);
}

// The weights of every unit (gathered: a collective when sharded), in order.
std::vector<float> all_weights(ParameterProvider& params, const std::vector<UnitSpec>& units) {
  std::vector<float> out;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const Tensor& w : params.gather(int64_t(u)))
      out.insert(out.end(), w.data<float>(), w.data<float>() + w.numel());
    params.release(int64_t(u));
  }
  return out;
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, std::abs(double(a[i]) - b[i]));
  return largest;
}

const AdamWConfig kAdamW{0.9, 0.95, 1e-6, 0.1, 0.0};  // no clipping: the gradient as it is

// What is trained: every weight with AdamW; LoRA adapters on a frozen base (their gradients
// come through the same loss); every weight with GaLore (its projections and refreshes read the
// summed gradient, its scale multiplies the update).
enum class Variant { full, lora, galore };

const char* variant_name(Variant v) {
  return v == Variant::full ? "AdamW" : v == Variant::lora ? "LoRA" : "GaLore";
}

const LoraConfig& lora_config() {
  static const LoraConfig lora = [] {
    LoraConfig l;
    l.rank = 3;
    l.alpha = 6;
    l.targets = lora_targets_from_names("q_proj,v_proj,down_proj");
    return l;
  }();
  return lora;
}

std::vector<UnitSpec> units_of(Variant v) {
  return v == Variant::lora ? lora_units(tiny_config(), lora_config()) : llama_units(tiny_config());
}

LlamaModel model_of(Variant v) {
  LlamaModel model(tiny_config());
  if (v == Variant::lora) model.set_lora(&lora_config());
  return model;
}

std::unique_ptr<Optimizer> optimizer_of(Variant v, ParameterProvider& params, Arena* arena) {
  if (v == Variant::galore) {
    GaloreConfig g;
    g.projector.kind = GaloreProjectorKind::randomized;
    g.projector.rank = 4;
    g.update_proj_gap = 2;  // refreshes at steps 1 and 3
    g.seed = 11;
    return arena ? std::make_unique<GaloreAdamW>(params.trainable(), kAdamW, g, *arena)
                 : std::make_unique<GaloreAdamW>(params.trainable(), kAdamW, g);
  }
  return arena ? std::make_unique<AdamW>(params.trainable(), kAdamW, *arena)
               : std::make_unique<AdamW>(params.trainable(), kAdamW);
}

// One rank, the whole batch as one micro-batch, every step: what every split must reproduce.
struct Reference {
  std::vector<StepResult> steps;
  std::vector<std::vector<float>> weights;  // after each step
};

Reference train_reference(Variant variant) {
  LlamaModel model = model_of(variant);
  LocalParameters whole(units_of(variant), 5, kInitStd, true);
  const std::unique_ptr<Optimizer> optimizer = optimizer_of(variant, whole, nullptr);
  Reference ref;
  INFO(variant_name(variant));
  // The largest relative gap of each wrong mean to the true one over the steps (one wrong mean
  // may cross the true one at some step while the groups' losses drift).
  double gap_by_micro = 0, gap_by_dp_rank = 0, gap_by_cp_rank = 0;
  for (int64_t step = 1; step <= kSteps; ++step) {
    const GlobalBatch g = global_batch(step);
    // The loss, computed here in float64 from the logits before the step.
    const std::vector<double> losses = token_losses_f64(model, whole, g);
    const double mean = mean_of_group_means(losses, 1, [](int64_t, int64_t) { return 0; });
    // What a mean by micro-batch (4 accumulation steps), by dp rank (2, one micro-batch) or by
    // cp rank (2) would say.
    const double by_micro =
        mean_of_group_means(losses, 4, [](int64_t r, int64_t) { return r / kQuarter; });
    const double by_dp_rank =
        mean_of_group_means(losses, 2, [](int64_t r, int64_t) { return r / (kRows / 2); });
    const double by_cp_rank =
        mean_of_group_means(losses, 2, [](int64_t, int64_t p) { return cp_rank_of(p, 2); });
    gap_by_micro = std::max(gap_by_micro, std::abs(by_micro - mean) / mean);
    gap_by_dp_rank = std::max(gap_by_dp_rank, std::abs(by_dp_rank - mean) / mean);
    gap_by_cp_rank = std::max(gap_by_cp_rank, std::abs(by_cp_rank - mean) / mean);

    const StepResult result = train_step(model, whole, *optimizer, {rows_of(g, 0, kRows)}, nullptr,
                                         kLr, step, CheckpointPolicy::none);
    CHECK(result.tokens == g.trained_targets);
    CHECK(result.loss == Approx(mean).epsilon(kLossTolerance));
    ref.steps.push_back(result);
    ref.weights.push_back(all_weights(whole, units_of(variant)));
  }
  // The masks tell every wrong mean apart from the true one.
  INFO("largest relative gaps: per micro-batch "
       << gap_by_micro << ", per dp rank " << gap_by_dp_rank << ", per cp rank " << gap_by_cp_rank);
  for (double gap : {gap_by_micro, gap_by_dp_rank, gap_by_cp_rank})
    REQUIRE(gap > kDiscrimination * kLossTolerance);
  return ref;
}

void check_split(Variant variant, const Split& split, const Reference& ref) {
  MeshShape shape;
  shape.cp = split.cp;
  shape.dp_shard = split.dp_shard > 0 ? split.dp_shard : split.dp;
  Mesh mesh = make_mesh(shape, 60);
  REQUIRE(mesh.dp_size == split.dp);
  LlamaModel model = model_of(variant);
  AttentionOperator ring;
  if (mesh.cp_size > 1) {
    ring = ring_attention_operator(*mesh.cp);
    model.set_attention(&ring);
  }
  Arena params_arena("norm params", Device::cpu), grads_arena("norm grads", Device::cpu),
      gathered_arena("norm gathered", Device::cpu), optim_arena("norm optim", Device::cpu);
  Zero3Replicas replicas;
  replicas.comm = mesh.replica.get();
  Zero3Parameters sharded(units_of(variant), *mesh.shard,
                          {&params_arena, &grads_arena, &gathered_arena}, 5, kInitStd, true, {},
                          replicas);
  const std::unique_ptr<Optimizer> optimizer = optimizer_of(variant, sharded, &optim_arena);
  StepComms comms;
  comms.world = mesh.world.get();
  comms.shard = mesh.shard.get();
  comms.replica = mesh.replica.get();

  INFO(variant_name(variant) << ", " << split.describe() << " on " << mesh.world->size()
                             << " ranks");
  for (int64_t step = 1; step <= kSteps; ++step) {
    const GlobalBatch g = global_batch(step);
    const StepResult& want = ref.steps[size_t(step - 1)];
    const StepResult got =
        train_step(model, sharded, *optimizer, local_micro_batches(g, split, mesh), comms, kLr,
                   step, CheckpointPolicy::selective);
    const double difference =
        max_difference(all_weights(sharded, units_of(variant)), ref.weights[size_t(step - 1)]);
    INFO("step " << step << ": loss " << got.loss << " (one rank " << want.loss << "), norm "
                 << got.grad_norm << " (" << want.grad_norm << "), largest weight difference "
                 << difference);
    CHECK(got.tokens == g.trained_targets);
    CHECK(got.loss == Approx(want.loss).epsilon(kLossTolerance));
    CHECK(got.grad_norm == Approx(want.grad_norm).epsilon(kNormTolerance));
    CHECK(difference < kWeightTolerance);
  }
}

// The splits this world size can run: cp 1 and 2, accumulation 1, 2 and 4, as far as the
// rows divide; and hybrid sharding (2 replicas) at 4 accumulation steps.
std::vector<Split> splits_for(int world) {
  std::vector<Split> out;
  for (int64_t cp : {1, 2}) {
    if (world % cp != 0) continue;
    const int64_t dp = world / cp;
    for (int64_t accum : {1, 2, 4})
      if (kRows % (dp * accum) == 0) out.push_back({accum, dp, cp});
    if (dp % 2 == 0 && kRows % (dp * 4) == 0) out.push_back({4, dp, cp, dp / 2});
  }
  return out;
}

}  // namespace

TEST_CASE("a masked loss is the mean over the global batch's trained targets on every split",
          "[normalization][mpi]") {
  const std::vector<Split> splits = splits_for(mpi_world_size());
  SECTION("every weight, AdamW: every split") {
    const Reference ref = train_reference(Variant::full);
    for (const Split& split : splits) check_split(Variant::full, split, ref);
  }
  // LoRA and GaLore on the splits of the most micro-batches, flat and hybrid, cp 1 and 2.
  for (Variant variant : {Variant::lora, Variant::galore})
    SECTION(std::string(variant_name(variant)) + ": 4 accumulation steps") {
      const Reference ref = train_reference(variant);
      for (const Split& split : splits)
        if (split.accum == 4) check_split(variant, split, ref);
    }
}

TEST_CASE("a global batch with no trained target is an error naming the step, changing nothing",
          "[normalization][mpi]") {
  const int world = mpi_world_size();
  const Split split{2, world % 2 == 0 ? world / 2 : world, world % 2 == 0 ? 2 : 1};
  MeshShape shape;
  shape.cp = split.cp;
  Mesh mesh = make_mesh(shape, 60);
  const LlamaConfig config = tiny_config();
  LlamaModel model(config);
  AttentionOperator ring;
  if (mesh.cp_size > 1) {
    ring = ring_attention_operator(*mesh.cp);
    model.set_attention(&ring);
  }
  StepComms comms;
  comms.world = mesh.world.get();
  // Two runs alike: one meets a batch with nothing to train at step 2, the other does not.
  struct Run {
    Arena params_arena{"masked params", Device::cpu}, grads_arena{"masked grads", Device::cpu},
        gathered_arena{"masked gathered", Device::cpu}, optim_arena{"masked optim", Device::cpu};
    Zero3Parameters params;
    AdamW optimizer;
    explicit Run(const Mesh& mesh)
        : params(llama_units(tiny_config()), *mesh.shard,
                 {&params_arena, &grads_arena, &gathered_arena}, 5, kInitStd),
          optimizer(params.trainable(), kAdamW, optim_arena) {}
  };
  Run failing(mesh), clean(mesh);
  const auto step_of = [&](Run& run, int64_t step, const GlobalBatch& g) {
    return train_step(model, run.params, run.optimizer, local_micro_batches(g, split, mesh), comms,
                      kLr, step, CheckpointPolicy::none);
  };
  step_of(failing, 1, global_batch(1));
  step_of(clean, 1, global_batch(1));
  const std::vector<float> before = all_weights(failing.params, llama_units(config));
  int64_t thrown_step = 0;
  const std::string message = test::error_of([&] {
    try {
      step_of(failing, 2, global_batch(2, true));
    } catch (const NothingToTrain& e) {
      thrown_step = e.step;
      throw;
    }
  });
  INFO(message);
  CHECK(thrown_step == 2);
  CHECK(test::contains(message, "train step 2: every target of the global batch"));
  CHECK(test::contains(message, "(2 micro-batches on each of " + std::to_string(world) + " rank"));
  CHECK(test::contains(message, "is masked out of the loss: nothing to train"));
  CHECK(max_difference(all_weights(failing.params, llama_units(config)), before) == 0);
  // Nothing moved, the optimizer's moments neither: step 2 on a batch with targets then gives
  // what it gives in a run that never met the empty one, bit for bit.
  const StepResult after_error = step_of(failing, 2, global_batch(3));
  const StepResult never = step_of(clean, 2, global_batch(3));
  CHECK(after_error.tokens == global_batch(3).trained_targets);
  CHECK(after_error.loss == never.loss);
  CHECK(after_error.grad_norm == never.grad_norm);
  CHECK(max_difference(all_weights(failing.params, llama_units(config)),
                       all_weights(clean.params, llama_units(config))) == 0);
}
