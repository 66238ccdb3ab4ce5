// A step's FLOPs, its traffic per link class, and the time bound with frugal's overlap.
#include "plan/step_time.h"

#include <algorithm>

#include "model/lora.h"
#include "optim/galore_adamw.h"
#include "plan/memory_plan.h"
#include "quant/hqq.h"
#include "quant/nf4.h"

namespace frugal {

namespace {

// Bytes per weight of a 4-bit base as gathered: codes and the per-block (NF4: 8-bit absmax
// codes per 64) or per-group (HQQ: fp32 scale and zero per 64) values.
double encoded_bytes_per_weight(TrainType type) {
  if (type == TrainType::qlora) return 0.5 + 1.0 / double(kNf4BlockSize);
  return 0.5 + 8.0 / double(kHqqGroupSize);
}

// Sums over one kind of unit, in elements or bytes.
struct UnitSums {
  double gathered_bytes = 0;  // the whole unit as ZeRO-3 gathers it
  double trainable = 0;       // trainable elements
  double projected = 0;       // trainable elements GaLore projects, weighted by r / min(m, n)
  double matmul = 0;          // weights of the matrix products (FLOPs: 2 per weight and token)
  double adapters = 0;        // LoRA adapters' weights
};

}  // namespace

StepTime estimate_step_time(const TrainConfig& c, const MeshShape& mesh, const Cluster& cluster) {
  const LlamaConfig& m = c.model;
  const bool lora = c.train.type != TrainType::full;
  LoraConfig lora_config;
  if (lora) {
    lora_config.rank = c.lora.rank;
    lora_config.targets = lora_targets_from_names(c.lora.targets);
  }
  const std::vector<UnitSpec> units = lora ? lora_units(m, lora_config) : llama_units(m);
  const bool four_bit = c.train.type == TrainType::qlora || c.train.type == TrainType::hqq_lora;
  const int64_t galore_rank = c.optim.type == OptimizerType::galore_adamw ? c.galore.rank : 0;
  // FP8 weight gathers: the trained projections the FP8 GEMMs read, one byte a weight.
  const std::function<bool(const ParamSpec&)> fp8_gathered =
      fp8_gathered_weights(c, mesh.shard, /*gpu=*/true);
  const auto gathered_as_fp8 = [&](const ParamSpec& p) { return fp8_gathered && fp8_gathered(p); };

  // embed, blocks (all of them), head
  UnitSums embed, blocks, head;
  for (size_t u = 0; u < units.size(); ++u) {
    UnitSums& s = u == 0 ? embed : u + 1 == units.size() ? head : blocks;
    for (const ParamSpec& p : units[u].params) {
      const double n = double(shape_numel(p.shape));
      const bool adapter = is_lora_a(p.name) || is_lora_b(p.name);
      const bool projection = p.shape.size() == 2 && is_block_projection(p.name);
      s.gathered_bytes += n * (four_bit && projection && !p.trainable
                                   ? encoded_bytes_per_weight(c.train.type)
                               : gathered_as_fp8(p) ? 1.0
                                                    : 2.0);  // bf16 copies
      if (p.trainable) s.trainable += n;
      if (p.trainable && galore_rank > 0 && galore_projects(p.name, p.shape))
        s.projected += n * double(galore_rank_of(p.shape, galore_rank)) /
                       double(std::min(p.shape[0], p.shape[1]));
      else if (p.trainable)
        s.projected += n;
      if (adapter) s.adapters += n;
      if (projection || p.name == "lm_head.weight") s.matmul += n;
    }
  }
  if (m.tie_word_embeddings) head.matmul += double(m.vocab_size * m.hidden_size);

  StepTime t;
  const int64_t cp = std::max<int64_t>(1, mesh.cp);
  const double rank_tokens = double(c.train.micro_batch_size * c.train.seq_len) / double(cp);
  t.tokens =
      c.train.micro_batch_size * c.train.seq_len * c.train.grad_accum_steps * (mesh.ranks() / cp);

  // --- FLOPs per token: 2 per weight forward, 2 more for the input's gradient and 2 for the
  // weight's (none for a frozen base); attention 6 L A S (PaLM's count, causal-halved), 2 of them
  // forward. Full checkpointing runs every block's forward again. A sliding window W < S
  // leaves (W (W + 1) / 2 + (S - W) W) / S keys per query instead of S / 2 (the kernels skip
  // the tiles outside it).
  const double attention_width = double(m.num_attention_heads * m.attention_head_dim());
  const double seq = double(c.train.seq_len), window = double(m.sliding_window);
  const double keys_per_query = m.sliding_window > 0 && window < seq
                                    ? (window * (window + 1) / 2 + (seq - window) * window) / seq
                                    : seq / 2;
  const double attention_fwd = 4.0 * double(m.num_hidden_layers) * attention_width * keys_per_query;
  const double weights = blocks.matmul + head.matmul;
  const double adapters = blocks.adapters;
  double forward = 2 * weights + 2 * adapters + attention_fwd;
  double backward = (lora ? 2 * weights : 4 * weights) + 4 * adapters + 2 * attention_fwd;
  if (c.train.activation_checkpointing == CheckpointPolicy::full)
    backward += 2 * blocks.matmul + 2 * adapters + attention_fwd;
  const double c_forward = forward * rank_tokens / cluster.gpu_flops;
  const double c_backward = backward * rank_tokens / cluster.gpu_flops;

  // --- bytes per micro-batch: ZeRO-3 over the shard group (every unit gathered for the forward,
  // the blocks again for the backward, fp32 gradients reduce-scattered)
  const double shard = double(std::max<int64_t>(1, mesh.shard));
  const double frac = (shard - 1) / shard;
  const double all_gathered = embed.gathered_bytes + blocks.gathered_bytes + head.gathered_bytes;
  const double trainable = embed.trainable + blocks.trainable + head.trainable;
  const double ag_forward = frac * all_gathered;
  const double ag_backward = frac * blocks.gathered_bytes;
  const double reduce_scatter = frac * 4 * trainable;
  // Ring attention: cp - 1 K/V blocks (bf16) per layer forward and backward, cp dK/dV (fp32).
  const double kv = double(m.num_hidden_layers) * rank_tokens * 2 *
                    double(m.num_key_value_heads * m.attention_head_dim());
  const double ring_forward = cp > 1 ? double(cp - 1) * kv * 2 : 0;
  const double ring_backward = cp > 1 ? double(cp - 1) * kv * 2 + double(cp) * kv * 4 : 0;
  // Offload: the gradient shards come down every micro-batch, the bf16 copies go up once a
  // step (optimizer) or with every gather (params).
  const bool host_state = c.parallel.offload != Offload::none;
  const double down = host_state ? 4 * trainable / shard : 0;
  const double copies_up = c.parallel.offload == Offload::optimizer ? 2 * trainable / shard : 0;
  const double uploads_forward = c.parallel.offload == Offload::params ? all_gathered / shard : 0;
  const double uploads_backward =
      c.parallel.offload == Offload::params ? blocks.gathered_bytes / shard : 0;
  // Hybrid: each rank's gradient shard (bf16; GaLore's projected matrices as r x n) all-reduced
  // across the replicas once a step.
  const double replicas = double(std::max<int64_t>(1, mesh.replicas));
  const double projected = embed.projected + blocks.projected + head.projected;
  const double all_reduce = 2 * (replicas - 1) / replicas * 2 * projected / shard;

  // A flat group over several nodes runs at its slowest link: the network, or the GPUs' link
  // within a node where that is slower (there is none with one GPU a node).
  const double shard_link =
      !mesh.shard_spans_nodes       ? cluster.link_intra_bytes_per_s
      : cluster.gpus_per_node > 1 ? std::min(cluster.link_intra_bytes_per_s,
                                             cluster.link_inter_bytes_per_s)
                                  : cluster.link_inter_bytes_per_s;
  auto over = [](double bytes, double per_s) { return bytes > 0 ? bytes / per_s : 0.0; };
  const double accum = double(c.train.grad_accum_steps);
  const double group_bytes =
      ag_forward + ag_backward + reduce_scatter + ring_forward + ring_backward;
  (mesh.shard_spans_nodes ? t.bytes.inter_node : t.bytes.intra_node) += accum * group_bytes;
  t.bytes.inter_node += all_reduce;
  t.bytes.host = accum * (down + uploads_forward + uploads_backward) + copies_up;

  const double host_link = cluster.host_link_bytes_per_s;
  const double comm_forward =
      over(ag_forward + ring_forward, shard_link) + over(uploads_forward, host_link);
  // (The gradients' way down and the copies' way up are inside the measured offload cost.)
  const double comm_backward = over(ag_backward + reduce_scatter + ring_backward, shard_link) +
                               over(uploads_backward, host_link);
  // Not hidden: the first unit's gather before anything computes, the embedding's
  // reduce-scatter after the last block's backward.
  const double fill = over(frac * embed.gathered_bytes, shard_link);
  const double drain = over(frac * 4 * embed.trainable, shard_link);
  const double cross = over(all_reduce, cluster.link_inter_bytes_per_s);

  double step = 0;
  for (int64_t k = 0; k < c.train.grad_accum_steps; ++k) {
    const bool last = k + 1 == c.train.grad_accum_steps;
    step += std::max(c_forward, comm_forward) + fill;
    step += std::max(c_backward, comm_backward + (last ? cross : 0)) + drain;
  }
  // Offload: the host's share of the step, as measured.
  if (host_state) step += trainable / shard * kMeasuredOffloadHostSecondsPerWeight;

  t.flops = accum * (forward + backward) * rank_tokens;
  t.compute_s = accum * (c_forward + c_backward);
  t.comm_s = accum * (comm_forward + comm_backward) + cross;
  t.step_s = step;
  return t;
}

}  // namespace frugal
