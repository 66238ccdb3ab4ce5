// The state's bytes per rank, from the ZeRO-3 row layout of every parameter.
#include "train/memory_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/checked.h"
#include "model/lora.h"
#include "optim/galore_adamw.h"
#include "optim/galore_memory.h"

namespace frugal {

// GaLore's fp32 state of one matrix [m, n] on a rank holding shard_rows of its rows: right side
// (m >= n) moments [shard_rows, r] and a replicated Q [r, n]; left side replicated moments
// [r, n] and P's rows [shard_rows, r].
size_t galore_state_bytes(const Shape& shape, size_t shard_rows, int64_t rank) {
  const size_t r = size_t(galore_rank_of(shape, rank)), n = size_t(shape[1]);
  if (galore_side(shape) == GaloreSide::right) return 4 * (2 * shard_rows * r + r * n);
  return 4 * (2 * r * n + shard_rows * r);
}

MemoryPlan plan_memory(const std::vector<UnitSpec>& units, const PlanSettings& s) {
  MemoryPlan plan;
  const size_t ranks = size_t(std::max(1, s.ranks));
  const size_t master = s.state == StateDType::bf16 ? 2 : 4;  // bytes per element
  const size_t compute = s.gpu ? 2 : 4;                       // gathered weights
  size_t largest_unit = 0;
  std::vector<GaloreMatrixRows> projected;  // GaLore's matrices, in the optimizer's order
  for (const UnitSpec& unit : units) {
    size_t unit_bytes = 0;
    for (const ParamSpec& p : unit.params) {
      // The padded row shard: ceil(rows / ranks) rows of every rank.
      const size_t rows = p.shape.empty() ? 1 : size_t(p.shape[0]);
      const size_t row_len = rows ? size_t(shape_numel(p.shape)) / rows : 0;
      const size_t shard_rows = (rows + ranks - 1) / ranks;
      const size_t shard = checked_mul(shard_rows, row_len, "a parameter shard's elements");
      const size_t padded = checked_mul(shard, ranks, "a parameter's padded elements");
      const bool encoded = !p.trainable && s.four_bit && s.four_bit(p);
      if (p.trainable) {
        plan.params += checked_mul(shard, master, "the parameter shards' bytes");
        plan.grads += shard * master;
        const bool galore = s.galore && galore_projects(p.name, p.shape);
        const size_t optimizer =
            galore ? galore_state_bytes(p.shape, shard_rows, s.galore->projector.rank)
                   : 2 * shard * master;
        if (galore) projected.push_back({p.shape, int64_t(shard_rows)});
        plan.optimizer += optimizer;
        if (s.checkpoint_staging)
          plan.checkpoint_staging += checkpoint_staging_bytes(shard, optimizer, master, galore);
        if (s.gpu && s.state == StateDType::fp32) plan.copies += shard * 2;
        if (ranks == 1 && s.fp8_gathered && s.fp8_gathered(p)) plan.fp8_codes += shard;
      } else if (encoded) {
        // Two codes a byte and the block scales: NF4's absmax code per 64 (and the whole
        // tensor's second-level scale per 256 blocks, on every rank), HQQ's scale and zero.
        const size_t blocks = shard / 64;
        const size_t parts =
            shard / 2 +
            (s.four_bit_hqq ? 8 * blocks : blocks + 4 * ((rows * row_len / 64 + 255) / 256));
        (s.gpu ? plan.copies : plan.params) += parts;
      } else {
        // A frozen weight on a GPU keeps only its bf16 copy; on the CPU its fp32 master.
        (s.gpu ? plan.copies : plan.params) += shard * (s.gpu ? 2 : 4);
      }
      // A 4-bit weight is gathered as its codes and made whole one matrix at a time (QLoRA's
      // gather_compressed): its codes are what the unit holds for sure.
      unit_bytes += (encoded ? padded / 2 : padded * compute) + (p.trainable ? padded * 4 : 0);
    }
    largest_unit = std::max(largest_unit, unit_bytes);
  }
  plan.gathered = 2 * largest_unit;
  plan.activation_inputs = s.activation_inputs;
  if (s.galore) {
    // The gradients GaLore reads are bf16 with bf16 state; the optimizer's products run on the
    // host on the CPU and with offload.
    const GaloreWorkingBytes working = galore_working_bytes(
        projected, *s.galore, s.state == StateDType::bf16, !s.gpu || s.offload != Offload::none);
    plan.galore_working = working.device;
    plan.galore_host = working.host;
  }
  if (!s.gpu) {
    plan.host = plan.params + plan.grads + plan.optimizer + plan.gathered + plan.fp8_codes +
                plan.activation_inputs + plan.galore_working + plan.galore_host;
    return plan;
  }
  plan.host += plan.activation_inputs + plan.galore_host;
  // Offload on a GPU: the fp32 state (master, gradients, moments) in pinned host memory; with
  // `params` the bf16 copies too.
  const bool host_state = s.offload != Offload::none;
  const size_t state = plan.params + plan.grads + plan.optimizer;
  (host_state ? plan.host : plan.device) += state;
  (s.offload == Offload::params ? plan.host : plan.device) += plan.copies;
  (host_state ? plan.host : plan.device) += plan.galore_working;  // beside the gradients
  plan.device += plan.gathered + plan.fp8_codes;
  return plan;
}

std::function<bool(const ParamSpec&)> fp8_gathered_weights(const TrainConfig& c,
                                                           int64_t shard_ranks, bool gpu) {
  if (!c.fp8.enabled || !c.fp8.gather_weights || c.train.type != TrainType::full ||
      c.fp8.recipe != Fp8Recipe::delayed)
    return nullptr;
  const std::vector<int> linears = projections_from_names(c.fp8.linears, "fp8.linears");
  shard_ranks = std::max<int64_t>(1, shard_ranks);
  return [linears, shard_ranks, gpu](const ParamSpec& p) {
    const int index = block_projection_index(p.name);
    if (!p.trainable || p.shape.size() != 2 || index < 0 ||
        std::find(linears.begin(), linears.end(), index) == linears.end())
      return false;
    const int64_t shard_rows = (p.shape[0] + shard_ranks - 1) / shard_ranks;
    return !gpu || (shard_rows % 16 == 0 && p.shape[1] % 16 == 0);
  };
}

GaloreConfig galore_config(const TrainConfig& c) {
  GaloreConfig galore;
  galore.projector.kind = c.galore.projector;
  galore.projector.rank = c.galore.rank;
  galore.projector.oversampling = c.galore.oversampling;
  galore.projector.power_iterations = c.galore.power_iterations;
  galore.update_proj_gap = c.galore.update_proj_gap;
  galore.scale = c.galore.scale;
  galore.moments_on_refresh = c.galore.moments_on_refresh;
  galore.stagger = c.galore.stagger;
  galore.refresh = c.galore.refresh;
  galore.precision = c.galore.precision;
  galore.profile = c.galore.profile;
  galore.seed = c.train.seed;
  return galore;
}

int64_t local_tokens(const TrainConfig& c, int64_t cp) {
  const int64_t seq = cp > 1 ? (c.train.seq_len + 2 * cp - 1) / (2 * cp) * 2 : c.train.seq_len;
  return c.train.micro_batch_size * seq;
}

size_t offloaded_input_bytes(const TrainConfig& c, int64_t cp, bool gpu) {
  if (c.train.activation_offload != ActivationOffload::inputs) return 0;
  const size_t blocks = size_t(std::max<int64_t>(0, c.model.num_hidden_layers - 1));
  const size_t row = checked_mul(size_t(c.model.hidden_size), size_t(gpu ? 2 : 4), "a row's bytes");
  return checked_mul(checked_mul(blocks, size_t(local_tokens(c, cp)), "offloaded rows"), row,
                     "the offloaded activations' bytes");
}

std::string gib(size_t bytes) {
  char buf[32];
  if (bytes >= (size_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / 1073741824.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / 1048576.0);
  return buf;
}

std::string describe(const MemoryPlan& plan) {
  std::string out;
  auto add = [&out](const char* what, size_t bytes) {
    if (bytes == 0) return;
    out += (out.empty() ? "" : ", ") + std::string(what) + " " + gib(bytes);
  };
  add("parameters", plan.params);
  add("gradients", plan.grads);
  add("optimizer", plan.optimizer);
  add("weight copies", plan.copies);
  add("two gathered units", plan.gathered);
  add("FP8 weight codes of the step", plan.fp8_codes);
  add("GaLore temporaries", plan.galore_working);
  add("GaLore host factorisations", plan.galore_host);
  add("offloaded activations", plan.activation_inputs);
  return out;
}

}  // namespace frugal
