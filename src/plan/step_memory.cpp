// A rank's memory, phase by phase, as the caching allocator will see it.
#include "plan/step_memory.h"

#include <algorithm>
#include <array>
#include <map>
#include <span>
#include <vector>

#include "core/slab_arena.h"
#include "model/llama_mlp.h"
#include "model/lora.h"
#include "optim/galore_adamw.h"
#include "optim/galore_memory.h"
#include "plan/memory_plan.h"
#include "quant/hqq.h"
#include "quant/nf4.h"

namespace frugal {

const char* memory_part_name(MemoryPart part) {
  switch (part) {
    case MemoryPart::state:
      return "state";
    case MemoryPart::activations:
      return "activations";
    case MemoryPart::block_work:
      return "block_work";
    case MemoryPart::gathered:
      return "gathered";
    case MemoryPart::dequantized:
      return "dequantized";
    case MemoryPart::loss:
      return "loss";
    case MemoryPart::ring:
      return "ring";
    case MemoryPart::galore:
      return "galore";
    case MemoryPart::start_up:
      return "start_up";
    case MemoryPart::count:
      break;
  }
  return "?";
}

namespace {

// core/device.cpp's size classes (CachingArena): 512-byte steps up to 1 MiB, 2 MiB steps above.
size_t size_class(size_t bytes) {
  const size_t step = bytes <= (size_t(1) << 20) ? 512 : (size_t(2) << 20);
  return std::max<size_t>(1, (bytes + step - 1) / step) * step;
}

using PartCounts = std::array<int64_t, size_t(MemoryPart::count)>;

// The blocks in use in one phase of a step: size class -> blocks, by part.
struct Phase {
  std::map<size_t, PartCounts> blocks;
  void add(MemoryPart part, size_t bytes, int64_t n = 1) {
    if (bytes == 0 || n == 0) return;
    blocks[size_class(bytes)][size_t(part)] += n;
  }
  size_t in_use() const {
    size_t total = 0;
    for (const auto& [block, counts] : blocks)
      for (int64_t n : counts) total += block * size_t(n);
    return total;
  }
};

// One activation tensor of a block: elements per token and bytes per element; per_chunk: it
// exists for one chunk of the MLP's rows at a time (llama_mlp.h), else for every token.
struct PerToken {
  int64_t width;
  int bytes;
  bool per_chunk = false;
};

// The widths a block's tensors have: hidden, attention (q, o), key/value, ffn, heads.
struct BlockWidths {
  int64_t h, a, kv, f, heads, lora_rank, adapted;
};

// What block_forward keeps for the backward under each policy (llama_block.cpp, keep_only),
// bf16 activations and fp32 statistics.
std::vector<PerToken> kept(CheckpointPolicy policy, const BlockWidths& w) {
  std::vector<PerToken> t;
  const PerToken lora_t{w.lora_rank, 2};
  switch (policy) {
    case CheckpointPolicy::none:
      t = {{w.h, 2},     {w.h, 2}, {1, 4},   {w.a, 2}, {w.kv, 2}, {w.kv, 2}, {w.a, 2},
           {w.heads, 4}, {w.h, 2}, {w.h, 2}, {1, 4},   {w.f, 2},  {w.f, 2},  {w.f, 2}};
      break;
    case CheckpointPolicy::selective:  // x, rotated q and k, v, attention output + LSE, h, gate, up
      t = {{w.h, 2},     {w.a, 2}, {w.kv, 2}, {w.kv, 2}, {w.a, 2},
           {w.heads, 4}, {w.h, 2}, {w.f, 2},  {w.f, 2}};
      break;
    case CheckpointPolicy::full:  // x alone
      return {{w.h, 2}};
  }
  for (int64_t i = 0; i < w.adapted; ++i) t.push_back(lora_t);
  return t;
}

// What block_recompute makes again before the backward; with the MLP in chunks, the MLP's part
// (n2, rstd2, gate, up, act) is made a chunk at a time in the backward instead.
std::vector<PerToken> recomputed(CheckpointPolicy policy, const BlockWidths& w, bool chunks) {
  switch (policy) {
    case CheckpointPolicy::none:
      return {};
    case CheckpointPolicy::selective:
      return {{w.h, 2}, {1, 4}, {w.h, 2, chunks}, {1, 4, chunks}, {w.f, 2, chunks}};
    case CheckpointPolicy::full: {
      // Everything but x, and q, k before rotary (forward_all keeps them while it runs).
      std::vector<PerToken> t = kept(CheckpointPolicy::none, w);
      t.erase(t.begin());
      for (size_t i = 8; i < 13; ++i) t[i].per_chunk = chunks;  // n2, rstd2, gate, up, act
      t.push_back({w.a, 2});
      t.push_back({w.kv, 2});
      for (int64_t i = 0; i < w.adapted; ++i) t.push_back({w.lora_rank, 2});
      return t;
    }
  }
  return {};
}

// block_backward's tensors (locals live to its end): dy; d_act, dg, du; d_n2, dh, d_attn; the
// attention kernels' fp32 dq, dk, dv and their scratch (2 floats per head and token), then their
// bf16 copies; rotary's dq, dk; d_n1 and dx. With the MLP in chunks, d_act, dg, du and d_n2 are
// a chunk's, and the chunk's dh is copied into the whole one. (Where the Hopper backward writes
// bf16 gradients, attention_backward_writes_bf16, the fp32 ones are never made: the plan, which
// does not know the GPU, counts them anyway, a few percent of a block's temporaries too many.)
std::vector<PerToken> backward_temporaries(const BlockWidths& w, bool chunks) {
  std::vector<PerToken> t = {
      {w.h, 2},  {w.f, 2, chunks}, {w.f, 2, chunks}, {w.f, 2, chunks}, {w.h, 2, chunks}, {w.h, 2},
      {w.a, 2},  {w.a, 4},         {w.kv, 4},        {w.kv, 4},        {2 * w.heads, 4}, {w.a, 2},
      {w.kv, 2}, {w.kv, 2},        {w.a, 2},         {w.kv, 2},        {w.h, 2},         {w.h, 2}};
  if (chunks) t.push_back({w.h, 2, true});
  return t;
}

// Tensors of `tokens` rows, or of `chunk` rows where they are a chunk's.
void add_tensors(Phase& phase, MemoryPart part, const std::vector<PerToken>& tensors,
                 int64_t tokens, int64_t times = 1, int64_t chunk = 0) {
  for (const PerToken& t : tensors)
    phase.add(part, size_t(t.width * (t.per_chunk && chunk > 0 ? chunk : tokens) * t.bytes), times);
}

enum class Encoding { none, nf4, hqq };

// One parameter's shard layout on a rank of a shard group of `ranks` (shard_layout.h: padded
// row shards).
struct ParamLayout {
  size_t shard = 0, padded = 0, rows = 0, numel = 0;
  Shape shape;
  bool trainable = true;
  Encoding encoding = Encoding::none;
};

// A 4-bit weight's parts (nf4_encoding.cpp, hqq_encoding.cpp) for `elements` of its rows.
std::vector<size_t> encoded_parts(const ParamLayout& p, size_t elements, bool with_scales) {
  if (p.encoding == Encoding::hqq)  // codes, fp32 scales and zeros per group
    return {elements / 2, elements / size_t(kHqqGroupSize) * 4,
            elements / size_t(kHqqGroupSize) * 4};
  // NF4: codes, 8-bit absmax codes per block, fp32 scales per 256 blocks of the whole tensor
  // (replicated: used where they are unless they are uploaded).
  const size_t blocks = p.numel / size_t(kNf4BlockSize);
  std::vector<size_t> parts = {elements / 2, elements / size_t(kNf4BlockSize)};
  if (with_scales)
    parts.push_back(4 * ((blocks + size_t(kNf4AbsmaxBlockSize) - 1) / size_t(kNf4AbsmaxBlockSize)));
  return parts;
}

}  // namespace

MemoryEstimate estimate_memory(const TrainConfig& c, const MeshShape& mesh) {
  const LlamaConfig& m = c.model;
  const size_t ranks = size_t(std::max<int64_t>(1, mesh.shard));
  const bool lora = c.train.type != TrainType::full;
  LoraConfig lora_config;
  if (lora) {
    lora_config.rank = c.lora.rank;
    lora_config.targets = lora_targets_from_names(c.lora.targets);
  }
  const std::vector<UnitSpec> units = lora ? lora_units(m, lora_config) : llama_units(m);
  const Encoding base_encoding = c.train.type == TrainType::qlora      ? Encoding::nf4
                                 : c.train.type == TrainType::hqq_lora ? Encoding::hqq
                                                                       : Encoding::none;
  const bool host_state = c.parallel.offload != Offload::none;
  const bool copies_on_host = c.parallel.offload == Offload::params;
  const size_t master = c.optim.bf16_master() ? 2 : 4;  // masters and gradient shards
  const size_t moment = c.optim.state_dtype == StateDType::bf16 ? 2 : 4;
  // One rank with fp32 state on the GPU: the backward adds into the gradient shards themselves.
  const bool direct_grads = ranks == 1 && !host_state && master == 4;
  const bool galore_on = c.optim.type == OptimizerType::galore_adamw;
  const int64_t galore_rank = galore_on ? c.galore.rank : 0;
  std::vector<GaloreMatrixRows> projected;  // in the optimizer's order
  // One rank keeps its FP8 weights' codes for the whole step (cast once a step).
  const std::function<bool(const ParamSpec&)> fp8_codes_kept =
      ranks == 1 ? fp8_gathered_weights(c, 1, /*gpu=*/true) : nullptr;

  std::vector<std::vector<ParamLayout>> layout(units.size());
  for (size_t u = 0; u < units.size(); ++u)
    for (const ParamSpec& spec : units[u].params) {
      ParamLayout p;
      p.shape = spec.shape;
      p.trainable = spec.trainable;
      p.rows = spec.shape.empty() ? 1 : size_t(spec.shape[0]);
      p.numel = size_t(shape_numel(spec.shape));
      const size_t row_len = p.rows ? p.numel / p.rows : 0;
      p.shard = (p.rows + ranks - 1) / ranks * row_len;
      p.padded = p.shard * ranks;
      if (!spec.trainable && spec.shape.size() == 2 && is_block_projection(spec.name))
        p.encoding = base_encoding;
      layout[u].push_back(p);
    }

  MemoryEstimate out;
  // --- the state: in every phase ----------------------------------------------------------
  Phase state;
  Phase start_up_extra;
  // The run's state arenas on a GPU are SlabArenas (run_memory.cpp): their small tensors pack
  // into whole slabs, one arena's apart from another's; larger ones take their own blocks.
  enum StateArena { kMasters, kGradients, kMoments, kCopies, kStateArenas };
  size_t packed[kStateArenas] = {};
  constexpr size_t kSlab = SlabArena::kDefaultSlabBytes;
  auto keep = [&](bool on_host, size_t bytes, StateArena arena) {
    if (on_host)
      out.host_state += bytes;
    else if (SlabArena::packs(bytes, kSlab))
      packed[arena] += SlabArena::carved_bytes(bytes);
    else
      state.add(MemoryPart::state, bytes);
  };
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t i = 0; i < units[u].params.size(); ++i) {
      const ParamLayout& p = layout[u][i];
      if (fp8_codes_kept && fp8_codes_kept(units[u].params[i]))
        state.add(MemoryPart::state, p.shard);
      if (p.trainable) {
        keep(host_state, p.shard * master, kMasters);
        keep(host_state, p.shard * master, kGradients);
        const size_t shard_rows = p.shard / (p.numel / p.rows);
        const OptimizerStateBytes optimizer = optimizer_state_bytes(
            units[u].params[i].name, p.shape, shard_rows, moment, c.optim.state_dtype, galore_rank);
        if (galore_rank > 0 && galore_projects(units[u].params[i].name, p.shape))
          projected.push_back({p.shape, int64_t(shard_rows)});
        for (int k = 0; k < 2; ++k) keep(host_state, optimizer.held / 2, kMoments);
        if (master == 4)
          keep(copies_on_host, p.shard * 2, kCopies);  // the bf16 copy the layers read
        if (host_state && !copies_on_host) out.host_state += p.shard * 2;  // its host staging
        if (c.ckpt.stages_saves())
          out.host_staging += checkpoint_staging_bytes(p.shard, optimizer.staged);
      } else if (p.encoding != Encoding::none) {
        for (size_t part : encoded_parts(p, p.shard, true)) keep(copies_on_host, part, kCopies);
      } else {
        keep(copies_on_host, p.shard * 2, kCopies);
        // Start-up: its fp32 master is made on the GPU, copied to bf16 and dropped (the
        // allocator keeps the block).
        if (!host_state) start_up_extra.add(MemoryPart::start_up, p.shard * 4);
      }
    }

  for (size_t bytes : packed)  // first fit leaves little but each arena's last slab part-empty
    state.add(MemoryPart::state, kSlab, int64_t((bytes + kSlab - 1) / kSlab));

  // --- what the units in flight hold -------------------------------------------------------
  const size_t embed = 0, block = 1, head = units.size() - 1;
  auto add_weights = [&](Phase& phase, size_t u) {
    for (const ParamLayout& p : layout[u]) {
      // On one rank the layers read the shards in place; offloaded ones are uploaded first.
      if (copies_on_host) {
        if (p.encoding != Encoding::none)
          for (size_t part : encoded_parts(p, p.shard, true)) phase.add(MemoryPart::gathered, part);
        else
          phase.add(MemoryPart::gathered, p.shard * 2);
      }
      if (ranks == 1) continue;
      if (p.encoding != Encoding::none)
        for (size_t part : encoded_parts(p, p.padded, false)) phase.add(MemoryPart::gathered, part);
      else
        phase.add(MemoryPart::gathered, p.padded * 2);
    }
  };
  auto add_full_grads = [&](Phase& phase, size_t u) {
    if (direct_grads) return;
    for (const ParamLayout& p : layout[u])
      if (p.trainable) phase.add(MemoryPart::gathered, p.padded * 4);
  };
  // A unit's reduction still in flight while the next unit's backward runs (several ranks, or
  // gradients on their way down to host memory).
  auto add_in_flight = [&](Phase& phase, size_t u) {
    if (direct_grads || (ranks == 1 && !host_state)) return;
    add_full_grads(phase, u);
    if (ranks > 1)
      for (const ParamLayout& p : layout[u])
        if (p.trainable) phase.add(MemoryPart::gathered, p.shard * 4);
  };

  // --- activations ---------------------------------------------------------------------------
  const int64_t d = m.attention_head_dim();
  const int64_t adapted = lora ? int64_t(lora_config.targets.size()) : 0;
  const BlockWidths w{m.hidden_size,
                      m.num_attention_heads * d,
                      m.num_key_value_heads * d,
                      m.intermediate_size,
                      m.num_attention_heads,
                      lora ? c.lora.rank : 0,
                      adapted};
  const int64_t cp = std::max<int64_t>(1, mesh.cp);
  const int64_t tokens = c.train.micro_batch_size * ((c.train.seq_len + 2 * cp - 1) / (2 * cp) * 2);
  const int64_t layers = m.num_hidden_layers;
  // The MLP in chunks (FP8's MLP linears keep it whole: counted whole whenever [fp8] is on).
  const int64_t chunk = mlp_chunk_rows(tokens, m, c.train.mlp_chunk_tokens);
  const bool chunks = chunk < tokens && !c.fp8.enabled;
  // One rank with bf16 state on the GPU: a block whose gradients each take one add (the model's
  // block_grad_sums) is handed its bf16 gradient shards, so it has no fp32 sums to gather.
  const bool block_grads_direct = ranks == 1 && !host_state && master == 2 && !lora &&
                                  !c.fp8.enabled && !m.qkv_bias() && !(chunk < tokens);
  std::vector<PerToken> saved = kept(c.train.activation_checkpointing, w);
  const std::vector<PerToken> again = recomputed(c.train.activation_checkpointing, w, chunks);
  const std::vector<PerToken> temporaries = backward_temporaries(w, chunks);
  // Activation offload: every block's input but the last waits in host memory; the device holds
  // the last block's input, and in the backward the input in use and the one coming back.
  const bool offload = c.train.activation_offload == ActivationOffload::inputs;
  const std::vector<PerToken> input = {saved.front()};
  if (offload) {
    saved.erase(saved.begin());
    out.host_activations = size_t(layers - 1) * size_t(tokens) * size_t(w.h) * 2;
  }

  auto with_state = [&](Phase phase) {
    for (const auto& [block_bytes, counts] : state.blocks)
      for (size_t k = 0; k < counts.size(); ++k) phase.blocks[block_bytes][k] += counts[k];
    return phase;
  };
  // 4-bit projections: one matrix at a time, each shape's block kept by the allocator: in bf16,
  // or, for the projections [fp8] covers, as the E4M3 codes cast straight from the 4 bits (one
  // byte a weight; WeightEncoding::decode_fp8).
  const std::vector<int> fp8_linears =
      c.fp8.enabled ? projections_from_names(c.fp8.linears, "fp8.linears") : std::vector<int>();
  auto add_dequantized = [&](Phase& phase) {
    std::map<size_t, bool> shapes;
    for (size_t i = 0; i < layout[block].size(); ++i) {
      const ParamLayout& p = layout[block][i];
      if (p.encoding == Encoding::none) continue;
      const int index = block_projection_index(units[block].params[i].name);
      const bool codes =
          std::find(fp8_linears.begin(), fp8_linears.end(), index) != fp8_linears.end();
      shapes[size_class(p.padded * (codes ? 1 : 2))] = true;
    }
    for (const auto& [bytes, yes] : shapes) phase.add(MemoryPart::dequantized, bytes);
  };
  auto add_ring = [&](Phase& phase) {
    if (cp == 1) return;
    // K/V double buffer (bf16) and three fp32 dK/dV accumulators (ring_attention.cpp). Packed
    // documents take the K/V straight from their owners, one block more of each in flight (auto
    // packs instruction and chat data, which the plan does not read: counted as if it does).
    const size_t extra = c.data.packing == Packing::windows ? 0 : 1;
    phase.add(MemoryPart::ring, size_t(tokens * 2 * w.kv * 2), 2 + extra);
    phase.add(MemoryPart::ring, size_t(tokens * 2 * w.kv * 4), 3 + extra);
  };

  std::vector<Phase> phases;
  {  // start-up: the state and the frozen fp32 masters before they are dropped
    Phase p = with_state(start_up_extra);
    phases.push_back(p);
  }
  {  // the loss: every layer's kept activations, the head's input, norm and chunks
    Phase p = with_state(Phase());
    add_tensors(p, MemoryPart::activations, saved, tokens, layers);
    if (offload) add_tensors(p, MemoryPart::activations, input, tokens);
    const int64_t rows = std::min(c.train.loss_chunk_tokens, tokens);
    add_tensors(p, MemoryPart::loss, {{w.h, 2}, {w.h, 2}, {1, 4}, {w.h, 2}}, tokens);
    p.add(MemoryPart::loss, size_t(rows * m.vocab_size * 2), 2);  // logits and their gradient
    p.add(MemoryPart::loss, size_t(rows * w.h * 2));
    add_weights(p, head);
    add_full_grads(p, head);
    phases.push_back(p);
  }
  for (int last = 1; last >= 0; --last) {  // the backward of the last block, of a middle one
    Phase p = with_state(Phase());
    add_tensors(p, MemoryPart::activations, saved, tokens, last ? layers : layers - 1);
    if (offload) add_tensors(p, MemoryPart::activations, input, tokens, 2);
    add_tensors(p, MemoryPart::block_work, again, tokens, 1, chunk);
    add_tensors(p, MemoryPart::block_work, temporaries, tokens, 1, chunk);
    add_weights(p, block);
    add_weights(p, block);  // the next one, gathered ahead
    if (!block_grads_direct) add_full_grads(p, block);
    add_in_flight(p, last ? head : block);
    add_dequantized(p);
    add_ring(p);
    phases.push_back(p);
  }
  {  // the embedding's backward, the last block's reduction in flight
    Phase p = with_state(Phase());
    add_tensors(p, MemoryPart::block_work, {{w.h, 2}}, tokens);
    add_full_grads(p, embed);
    add_in_flight(p, block);
    phases.push_back(p);
  }

  if (galore_on && !projected.empty()) {
    // The optimizer's step: GaLore's temporaries beside the state, where the gradients are
    // (host memory with offload). Counted as one block: they come and go within the step.
    // As the run configures it: hybrid sharding's projected replica sums hold every R too.
    GaloreConfig galore = galore_config(c);
    galore.projected_replica_sums = c.parallel.replica_galore_projection && mesh.replicas > 1;
    const GaloreWorkingBytes working =
        galore_working_bytes(projected, galore, master == 2, host_state);
    if (host_state) {
      out.host_state += working.device + working.host;
    } else {
      out.host_state += working.host;
      Phase p = with_state(Phase());
      p.add(MemoryPart::galore, working.device);
      phases.push_back(p);
    }
  }

  // The allocator's reservation: each size class at its most blocks in any phase. The run gives
  // the start-up's cache back before the first step (training_run.cpp trims the device arena once
  // the parameters are built), so the start-up phase reserves apart: the larger of the two.
  struct Reservation {
    size_t total = 0;
    size_t parts[size_t(MemoryPart::count)] = {};
  };
  auto reservation = [](std::span<const Phase> of) {
    std::map<size_t, const PartCounts*> most;
    for (const Phase& p : of)
      for (const auto& [block_bytes, counts] : p.blocks) {
        auto it = most.find(block_bytes);
        auto blocks = [](const PartCounts& c) {
          int64_t n = 0;
          for (int64_t k : c) n += k;
          return n;
        };
        if (it == most.end() || blocks(counts) > blocks(*it->second)) most[block_bytes] = &counts;
      }
    Reservation r;
    for (const auto& [block_bytes, counts] : most)
      for (size_t k = 0; k < counts->size(); ++k) {
        r.parts[k] += block_bytes * size_t((*counts)[k]);
        r.total += block_bytes * size_t((*counts)[k]);
      }
    return r;
  };
  for (const Phase& p : phases) out.device_in_use = std::max(out.device_in_use, p.in_use());
  const Reservation start_up = reservation(std::span<const Phase>(phases).first(1));
  const Reservation training = reservation(std::span<const Phase>(phases).subspan(1));
  const Reservation& peak = start_up.total > training.total ? start_up : training;
  out.device_reserved = peak.total;
  std::copy(std::begin(peak.parts), std::end(peak.parts), std::begin(out.parts));
  return out;
}

}  // namespace frugal
