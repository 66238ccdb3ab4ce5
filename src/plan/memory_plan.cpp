// The state's bytes per rank, from the ZeRO-3 row layout of every parameter.
#include "plan/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/checked.h"
#include "model/fp8_scaling.h"
#include "model/llama_mlp.h"
#include "model/lora.h"
#include "optim/galore_adamw.h"
#include "optim/galore_memory.h"
#include "optim/quantized_moments.h"

namespace frugal {

// GaLore's fp32 state of one matrix [m, n] on a rank holding shard_rows of its rows: right side
// (m >= n) moments [shard_rows, r] and a replicated Q [r, n]; left side replicated moments
// [r, n] and P's rows [shard_rows, r].
namespace {

// One moment of [rows, cols] values: 8-bit codes and an f32 absmax per block of 256 values within
// a row (ops::QuantizedMoment), or f32 (f32_bytes: 4 a value); staged, every tensor as f32.
OptimizerStateBytes moment_bytes(size_t rows, size_t cols, bool int8, size_t value_bytes) {
  const size_t values = rows * cols;
  if (!int8) return {values * value_bytes, values * 4};
  const size_t scales = rows * ((cols + 255) / 256) * 4;
  return {values + scales, values * 4 + scales};
}

OptimizerStateBytes galore_bytes(const Shape& shape, size_t shard_rows, int64_t rank,
                                 bool int8_state) {
  const size_t r = size_t(galore_rank_of(shape, rank)), n = size_t(shape[1]);
  const bool right = galore_side(shape) == GaloreSide::right;
  const Shape moment = right ? Shape{shape[0], int64_t(r)} : Shape{int64_t(r), int64_t(n)};
  const bool int8 = int8_state && int8_moments_apply(moment, AdamWConfig().int8_min_elements);
  const OptimizerStateBytes m =
      right ? moment_bytes(shard_rows, r, int8, 4) : moment_bytes(r, n, int8, 4);
  const size_t projector = 4 * (right ? r * n : shard_rows * r);
  return {2 * m.held + projector, 2 * m.staged + projector};
}

}  // namespace

size_t galore_state_bytes(const Shape& shape, size_t shard_rows, int64_t rank, bool int8_state) {
  return galore_bytes(shape, shard_rows, rank, int8_state).held;
}

OptimizerStateBytes optimizer_state_bytes(const std::string& name, const Shape& shape,
                                          size_t shard_rows, size_t moment, StateDType state,
                                          int64_t galore_rank) {
  const bool int8 = state == StateDType::int8;
  if (galore_rank > 0 && galore_projects(name, shape))
    return galore_bytes(shape, shard_rows, galore_rank, int8);
  const size_t rows = shape.empty() ? 1 : size_t(shape[0]);
  const size_t cols = rows ? size_t(shape_numel(shape)) / rows : 0;
  const bool quantized = int8 && int8_moments_apply(shape, AdamWConfig().int8_min_elements);
  const OptimizerStateBytes m = moment_bytes(shard_rows, cols, quantized, moment);
  return {2 * m.held, 2 * m.staged};
}

MemoryPlan plan_memory(const std::vector<UnitSpec>& units, const PlanSettings& s) {
  MemoryPlan plan;
  const size_t ranks = size_t(std::max(1, s.ranks));
  const bool bf16 = bf16_master(s.master, s.state);
  const size_t master = bf16 ? 2 : 4;                         // bytes per element
  const size_t moment = s.state == StateDType::bf16 ? 2 : 4;  // AdamW's moments
  // Gathered weights: bf16 on a GPU; on the CPU fp32, and bf16 masters are gathered as bf16
  // and then widened (both at once).
  const size_t compute = s.gpu ? 2 : bf16 ? 6 : 4;
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
        const OptimizerStateBytes optimizer = optimizer_state_bytes(
            p.name, p.shape, shard_rows, moment, s.state, s.galore ? s.galore->projector.rank : 0);
        if (galore) projected.push_back({p.shape, int64_t(shard_rows)});
        plan.optimizer += optimizer.held;
        if (s.checkpoint_staging)
          plan.checkpoint_staging += checkpoint_staging_bytes(shard, optimizer.staged);
        if (s.gpu && !bf16) plan.copies += shard * 2;
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
        // A frozen weight on a GPU keeps only its bf16 copy; on the CPU its master.
        (s.gpu ? plan.copies : plan.params) += shard * (s.gpu ? 2 : master);
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
    const GaloreWorkingBytes working =
        galore_working_bytes(projected, *s.galore, bf16, !s.gpu || s.offload != Offload::none);
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

namespace {

constexpr size_t kSaturated = std::numeric_limits<size_t>::max();

// The product of counts, or kSaturated when it does not fit (0 when a factor is 0).
size_t saturating_product(std::initializer_list<size_t> factors) {
  for (size_t f : factors)
    if (f == 0) return 0;
  size_t out = 1;
  for (size_t f : factors)
    if (!mul_fits(out, f, &out)) return kSaturated;
  return out;
}
size_t saturating_sum(std::initializer_list<size_t> terms) {
  size_t out = 0;
  for (size_t t : terms)
    if (!add_fits(out, t, &out)) return kSaturated;
  return out;
}
size_t count(int64_t v) { return size_t(std::max<int64_t>(0, v)); }
// `elements` of `half_bytes` / 2 bytes each (4-bit codes are half a byte), on one of `ranks`.
size_t rank_bytes(size_t elements, size_t half_bytes, size_t ranks) {
  const size_t doubled = saturating_product({elements, half_bytes});
  return doubled == kSaturated ? kSaturated : doubled / 2 / std::max<size_t>(1, ranks);
}
std::string count_text(size_t n) {
  return n == kSaturated ? "more than " + std::to_string(kSaturated) : std::to_string(n);
}
// gib()'s text, in TiB, PiB or EiB where those read better.
std::string floor_bytes_text(size_t bytes) {
  if (bytes == kSaturated) return "more than 16 EiB";
  if (bytes < (size_t(1) << 40)) return gib(bytes);
  const char* units[] = {"TiB", "PiB", "EiB"};
  double value = double(bytes) / double(size_t(1) << 40);
  int unit = 0;
  for (; unit < 2 && value >= 1024; ++unit) value /= 1024;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", value, units[unit]);
  return buf;
}

}  // namespace

std::vector<MemoryFloorPart> memory_floor(const TrainConfig& c, int64_t shard_ranks, int64_t cp,
                                          bool gpu) {
  const LlamaConfig& m = c.model;
  const size_t layers = count(m.num_hidden_layers), h = count(m.hidden_size),
               f = count(m.intermediate_size), heads = count(m.num_attention_heads),
               kv_heads = count(m.num_key_value_heads), d = count(m.attention_head_dim()),
               vocab = count(m.vocab_size), ranks = count(std::max<int64_t>(1, shard_ranks));
  const bool full = c.train.type == TrainType::full;
  const bool four_bit = c.train.type == TrainType::qlora || c.train.type == TrainType::hqq_lora;
  const bool galore = full && c.optim.type == OptimizerType::galore_adamw;
  const size_t master = c.optim.bf16_master() ? 2 : 4;
  const size_t moment = c.optim.state_dtype == StateDType::bf16 ? 2 : 4;
  // Where the state lives: a GPU's memory unless offloaded; frozen weights' copies stay on the
  // GPU unless the parameters are offloaded too.
  const bool state_on_device = gpu && c.parallel.offload == Offload::none;
  const bool frozen_on_device = gpu && c.parallel.offload != Offload::params;
  const size_t frozen_half_bytes = gpu ? 4 : 2 * master;  // a bf16 copy on a GPU, the master else
  const std::string over_ranks = " over " + std::to_string(ranks) + " shard rank(s)";
  std::vector<MemoryFloorPart> parts;

  // --- the weights -----------------------------------------------------------------------------
  const size_t block_params = saturating_sum({saturating_product({h, heads, d}),  // q, o
                                              saturating_product({h, heads, d}),
                                              saturating_product({2, h, kv_heads, d}),  // k, v
                                              saturating_product({3, h, f}),  // gate, up, down
                                              saturating_product({2, h})});   // the norms
  const size_t blocks_params = saturating_product({layers, block_params});
  const std::string block_keys =
      "model.num_hidden_layers = " + std::to_string(layers) + " blocks x " +
      count_text(block_params) + " parameters (model.hidden_size = " + std::to_string(h) +
      ", model.intermediate_size = " + std::to_string(f) +
      ", model.num_attention_heads = " + std::to_string(heads) +
      ", model.num_key_value_heads = " + std::to_string(kv_heads) +
      (m.head_dim > 0 ? ", model.head_dim = " : ", head dimension ") + std::to_string(d) + ")";
  // AdamW's two moments of a weight: 8-bit ones a byte each (their block scales, 1/64 more,
  // and the fp32 moments of small tensors are left out of a floor).
  const size_t moments = c.optim.state_dtype == StateDType::int8 ? 2 : 2 * moment;
  if (full) {
    // Master and gradient, and AdamW's two moments (GaLore's projected ones are smaller).
    const size_t per = galore ? 2 * master : 2 * master + moments;
    parts.push_back({"the blocks' weights and their training state: " + block_keys + " x " +
                         std::to_string(per) +
                         (galore ? " bytes (master and gradient)"
                                 : " bytes (master, gradient, "
                                   "two moments)") +
                         over_ranks,
                     rank_bytes(blocks_params, 2 * per, ranks), state_on_device});
  } else {
    parts.push_back({"the frozen blocks' weights: " + block_keys +
                         (four_bit             ? " x half a byte (4-bit codes)"
                          : gpu || master == 2 ? " x 2 bytes (bf16)"
                                               : " x 4 bytes (fp32)") +
                         over_ranks,
                     rank_bytes(blocks_params, four_bit ? 1 : frozen_half_bytes, ranks),
                     frozen_on_device});
    // Every adapter touches the residual stream's width on one side: A [r, hidden] or
    // B [hidden, r].
    const size_t targets = lora_targets_from_names(c.lora.targets).size();
    const size_t adapters = saturating_product({layers, targets, count(c.lora.rank), h});
    parts.push_back(
        {"LoRA's adapters and their training state: lora.rank = " + std::to_string(c.lora.rank) +
             " x " + std::to_string(targets) +
             " targets (lora.targets) x model.num_hidden_layers = " + std::to_string(layers) +
             " x model.hidden_size = " + std::to_string(h) + " x " +
             std::to_string(2 * master + moments) + " bytes (master, gradient, two moments)" +
             over_ranks,
         rank_bytes(adapters, 2 * (2 * master + moments), ranks), state_on_device});
  }
  const size_t tables = m.tie_word_embeddings ? 1 : 2;
  const size_t embedding = saturating_product({tables, vocab, h});
  parts.push_back(
      {std::string(m.tie_word_embeddings ? "the embedding" : "the embedding and the head") +
           ": model.vocab_size = " + std::to_string(vocab) +
           " x model.hidden_size = " + std::to_string(h) +
           (full  ? " x " + std::to_string(2 * master + moments) + " bytes"
            : gpu ? " x 2 bytes"
                  : " x " + std::to_string(master) + " bytes") +
           over_ranks,
       rank_bytes(embedding, full ? 2 * (2 * master + moments) : frozen_half_bytes, ranks),
       full ? state_on_device : frozen_on_device});

  // --- a micro-batch's activations -------------------------------------------------------------
  const size_t act = gpu ? 2 : 4;  // bf16 activations on a GPU, fp32 on the CPU
  const size_t tokens = saturating_product(
      {count(c.train.micro_batch_size),
       std::max<size_t>(1, count(c.train.seq_len) / count(std::max<int64_t>(1, cp)))});
  const std::string token_keys = count_text(tokens) + " tokens (train.micro_batch_size = " +
                                 std::to_string(c.train.micro_batch_size) +
                                 " x train.seq_len = " + std::to_string(c.train.seq_len) +
                                 (cp > 1 ? " / parallel.cp = " + std::to_string(cp) : "") + ")";
  parts.push_back({"the blocks' inputs kept for the backward: model.num_hidden_layers = " +
                       std::to_string(layers) + " x " + token_keys + " x model.hidden_size = " +
                       std::to_string(h) + " x " + std::to_string(act) + " bytes",
                   saturating_product({layers, tokens, h, act}),
                   gpu && c.train.activation_offload != ActivationOffload::inputs});
  const size_t loss_rows = std::min(tokens, count(c.train.loss_chunk_tokens));
  parts.push_back(
      {"the loss's logits: " + std::to_string(loss_rows) +
           " rows (train.loss_chunk_tokens = " + std::to_string(c.train.loss_chunk_tokens) +
           ", at most the " + token_keys + ") x model.vocab_size = " + std::to_string(vocab) +
           " x " + std::to_string(act) + " bytes",
       saturating_product({loss_rows, vocab, act}), gpu});
  // The MLP's rows at once (mlp_chunk_rows): the setting, else all up to kMlpWholeTokens and at
  // least kMlpMinChunkTokens beyond.
  const size_t mlp_rows = c.train.mlp_chunk_tokens > 0
                              ? std::min(tokens, count(c.train.mlp_chunk_tokens))
                          : tokens <= size_t(kMlpWholeTokens) ? tokens
                                                              : size_t(kMlpMinChunkTokens);
  parts.push_back(
      {"the MLP's gate and up rows: " + std::to_string(mlp_rows) +
           " rows (train.mlp_chunk_tokens = " + std::to_string(c.train.mlp_chunk_tokens) +
           ", of the " + token_keys + ") x 2 x model.intermediate_size = " + std::to_string(f) +
           " x " + std::to_string(act) + " bytes",
       saturating_product({mlp_rows, 2, f, act}), gpu});
  // Packed documents: each token's document bounds (i32 start and end) beside the ids. auto
  // packs instruction and chat data, which the plan does not read: counted as if it does.
  if (c.data.packing != Packing::windows)
    parts.push_back(
        {"the packed documents' bounds (data.packing = " + std::string(enum_name(c.data.packing)) +
             "): " + token_keys + " x 2 x 4 bytes",
         saturating_product({tokens, 2, 4}), gpu});
  parts.push_back({"the attention's queries: " + token_keys +
                       " x model.num_attention_heads = " + std::to_string(heads) +
                       (m.head_dim > 0 ? " x model.head_dim = " : " x head dimension ") +
                       std::to_string(d) + " x " + std::to_string(act) + " bytes",
                   saturating_product({tokens, heads, d, act}), gpu});
  if (c.fp8.enabled)
    parts.push_back(
        {"FP8's amax histories: fp8.amax_history_len = " + std::to_string(c.fp8.amax_history_len) +
             " x model.num_hidden_layers = " + std::to_string(layers) + " x " +
             std::to_string(kFp8SlotsPerBlock) + " tensors x 4 bytes",
         saturating_product({count(c.fp8.amax_history_len), layers, size_t(kFp8SlotsPerBlock), 4}),
         gpu});
  // Every rank lists every parameter (name, shape) before it allocates its shard.
  const size_t per_block =
      size_t(kBlockParamCount) + (full ? 0 : 2 * lora_targets_from_names(c.lora.targets).size());
  parts.push_back({"the parameter table: model.num_hidden_layers = " + std::to_string(layers) +
                       " x " + std::to_string(per_block) + " tensors x " +
                       std::to_string(sizeof(ParamSpec)) + " bytes",
                   saturating_product({layers, per_block, sizeof(ParamSpec)}), false});
  return parts;
}

void check_memory_floor(const std::vector<MemoryFloorPart>& parts, size_t node_ranks,
                        size_t available_host, size_t device_bytes) {
  size_t host = 0, device = 0;
  const MemoryFloorPart *largest_host = nullptr, *largest_device = nullptr;
  for (const MemoryFloorPart& p : parts) {
    if (p.bytes == kSaturated)
      fail(p.what, " come to more than 16 EiB per rank, more than any machine holds");
    size_t& total = p.on_device ? device : host;
    total = saturating_sum({total, p.bytes});
    const MemoryFloorPart*& largest = p.on_device ? largest_device : largest_host;
    if (!largest || p.bytes > largest->bytes) largest = &p;
  }
  const size_t node_host = saturating_product({host, std::max<size_t>(1, node_ranks)});
  if (available_host > 0 && node_host > available_host)
    fail(largest_host->what, " = ", floor_bytes_text(largest_host->bytes),
         " per rank: with the rest, the run needs at least ", floor_bytes_text(host),
         " of host memory per rank (", node_ranks,
         " rank(s) on this node: ", floor_bytes_text(node_host),
         ") before anything is allocated, and ", gib(available_host), " is available");
  if (device_bytes > 0 && device > device_bytes)
    fail(largest_device->what, " = ", floor_bytes_text(largest_device->bytes),
         " per rank: with the rest, the run needs at least ", floor_bytes_text(device),
         " of GPU memory per rank before anything is allocated, and the GPU has ",
         gib(device_bytes), " (parallel.gpu_mem_limit)");
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
