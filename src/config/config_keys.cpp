// The table of every training key (name, field, allowed values, doc) and what reads it: the
// text of a value, its parsing, its single-key rule, and doc/usage.md's rows.
#include "config/config_keys.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <sstream>

#include "core/log.h"
#include "model/lora.h"

namespace frugal {

const std::vector<ConfigSection>& config_sections() {
  static const std::vector<ConfigSection> sections = {
      {"model", "the Llama shape (Hugging Face key names)"},
      {"data", "the prepared corpus"},
      {"train", "the run"},
      {"lora", "adapters (train.type = lora, qlora or hqq_lora)"},
      {"optim", "the optimizer and clipping"},
      {"galore", "GaLore's low-rank moments (optim.type = galore_adamw)"},
      {"parallel", "ranks, sharding and offload (ZeRO-3 within a replica, replicas across nodes)"},
      {"ckpt", "checkpoints"},
      {"fp8",
       "FP8 block linears: E4M3 inputs and weights, E5M2 gradients (GPUs of sm_89+; the CPU "
       "emulates)"},
      {"monitor", "progress and metrics"}};
  return sections;
}

std::vector<ConfigKey> config_keys(TrainConfig& c) {
  LlamaConfig& m = c.model;
  TrainSettings& t = c.train;
  return {
      {"model.hidden_size", &m.hidden_size, kPositive, "width of the residual stream"},
      {"model.intermediate_size", &m.intermediate_size, kPositive, "width of the SwiGLU MLP"},
      {"model.num_hidden_layers", &m.num_hidden_layers, kPositive, "transformer blocks"},
      {"model.num_attention_heads", &m.num_attention_heads, kPositive, "query heads"},
      {"model.num_key_value_heads", &m.num_key_value_heads, kPositive,
       "key/value heads (grouped-query attention when fewer than the query heads)"},
      {"model.vocab_size", &m.vocab_size, kPositive, "vocabulary size; at least the tokenizer's"},
      {"model.head_dim", &m.head_dim, at_least(0), "head dimension (0: hidden_size / heads)"},
      {"model.max_position_embeddings", &m.max_position_embeddings, kPositive,
       "longest sequence the model is meant for"},
      {"model.rope_theta", &m.rope_theta, above(0), "rotary embedding base"},
      {"model.rope_scaling", &m.rope_scaling.type, kAny,
       "rotary scaling for long context, as transformers' rope_scaling: linear (position "
       "interpolation), dynamic (NTK), yarn, llama3. With model.hf_path it extends that model's "
       "context: its max_position_embeddings becomes the original, and factor times it the new "
       "one"},
      {"model.rope_scaling_factor", &m.rope_scaling.factor, at_least(1),
       "how many times the original context the scaled rotary embedding covers"},
      {"model.rope_original_max_position_embeddings",
       &m.rope_scaling.original_max_position_embeddings, at_least(0),
       "yarn, llama3: the context the model was trained for (0: max_position_embeddings)"},
      {"model.rope_low_freq_factor", &m.rope_scaling.low_freq_factor, above(0),
       "llama3: wavelengths above original / low_freq_factor are interpolated"},
      {"model.rope_high_freq_factor", &m.rope_scaling.high_freq_factor, above(0),
       "llama3: wavelengths below original / high_freq_factor are kept"},
      {"model.rope_beta_fast", &m.rope_scaling.beta_fast, above(0),
       "yarn: pairs turning more than this many times over the original context are kept"},
      {"model.rope_beta_slow", &m.rope_scaling.beta_slow, above(0),
       "yarn: pairs turning fewer times than this are interpolated"},
      {"model.rope_attention_factor", &m.rope_scaling.attention_factor, at_least(0),
       "yarn: factor on cos and sin (0: 0.1 ln(factor) + 1, as transformers)"},
      {"model.rms_norm_eps", &m.rms_norm_eps, above(0), "RMSNorm epsilon"},
      {"model.tie_word_embeddings", &m.tie_word_embeddings, kAny,
       "share the embedding matrix with the output head"},
      {"model.sliding_window", &m.sliding_window, at_least(0),
       "Mistral's sliding-window attention: token i attends to tokens i - W < j <= i (0: full "
       "causal attention)"},
      {"model.hf_path", &c.model_hf_path, kPath,
       "start from this Hugging Face model directory: its config.json replaces the [model] "
       "shape and its weights the initialisation (prepare the data with its tokenizer)"},

      {"data.dir", &c.data.dir, kPath,
       "directory written by `frugal prepare` (train.tok, val.tok, tokenizer.model or "
       "tokenizer.json)"},
      {"data.train_on", &c.data.train_on, kAny,
       "the tokens the loss learns from: assistant (every assistant turn of chat data), "
       "last_turn (the last assistant turn of each conversation), completion (the completion of "
       "instruction data: Alpaca, prompt/completion), all (every token, prompts too); auto: "
       "assistant for chat data, completion for instruction data, all for plain text"},
      {"data.packing", &c.data.packing, kAny,
       "how documents fill the windows of train.seq_len tokens: documents (whole documents back "
       "to back; attention stays inside each, positions restart at each, a document's last token "
       "predicts nothing), windows (the token stream cut every seq_len tokens, across documents), "
       "pad (one document per window, padded); auto: documents for instruction and chat data, "
       "windows for plain text"},
      {"data.long_documents", &c.data.long_documents, kAny,
       "a document longer than a window under data.packing = documents or pad: split (into "
       "pieces of seq_len tokens, each attending within itself) or truncate (its first seq_len "
       "tokens); either is counted in the log"},

      {"train.steps", &t.steps, kPositive, "optimizer steps"},
      {"train.seed", &t.seed, kAny, "seed of initialisation and data order"},
      {"train.out_dir", &t.out_dir, kPath,
       "where metrics.jsonl, checkpoints, the tokenizer and the resolved configuration go"},
      {"train.lr", &t.lr, above(0), "peak learning rate"},
      {"train.warmup_steps", &t.warmup_steps, at_least(0), "linear warm-up steps"},
      {"train.min_lr_ratio", &t.min_lr_ratio, closed(0, 1),
       "the cosine decay ends at lr x min_lr_ratio"},
      {"train.micro_batch_size", &t.micro_batch_size, kPositive,
       "sequences per micro-batch, per rank"},
      {"train.grad_accum_steps", &t.grad_accum_steps, kPositive,
       "micro-batches accumulated per optimizer step"},
      {"train.seq_len", &t.seq_len, kPositive, "tokens per sequence"},
      {"train.eval_every", &t.eval_every, at_least(0),
       "evaluate on the validation split every N steps (0: only at the end)"},
      {"train.eval_batches", &t.eval_batches, at_least(0),
       "validation micro-batches per rank per evaluation (0: the whole split)"},
      {"train.init_std", &t.init_std, above(0), "standard deviation of the normal initialisation"},
      {"train.type", &t.type, kAny,
       "train every weight (full), or freeze the base and train LoRA adapters ([lora]); qlora "
       "and hqq_lora keep the base's block projections in NF4 / HQQ 4-bit"},
      {"train.activation_checkpointing", &t.activation_checkpointing, kAny,
       "what a block keeps from its forward for the backward (the rest is recomputed)"},
      {"train.activation_offload", &t.activation_offload, kAny,
       "inputs: the blocks' inputs that checkpointing keeps wait for the backward in pinned host "
       "memory (every block but the last; copied beside the compute, back a layer ahead)"},
      {"train.mlp_chunk_tokens", &t.mlp_chunk_tokens, at_least(0),
       "rows of a block's MLP computed at once, forward and backward (0: whole up to 16384 "
       "tokens per rank, else chunks whose [rows, intermediate] tensors are half a [tokens, "
       "hidden] one, at least 8192 rows)"},
      {"train.loss_chunk_tokens", &t.loss_chunk_tokens, at_least(1),
       "rows of logits the head and the loss compute at once: [rows, vocab] logits and their "
       "gradient (larger is faster where memory allows: fewer passes over the head's weight "
       "gradient)"},
      {"train.resume", &t.resume, kAny, "continue from out_dir/ckpt/LATEST when it exists"},
      {"train.sample_tokens", &t.sample_tokens, at_least(0),
       "tokens generated from sample_prompt at the end (0: none)"},
      {"train.sample_prompt", &t.sample_prompt, kAny, "prompt of the sample"},

      {"lora.rank", &c.lora.rank, at_least(1), "rank r of each adapter: A [r, in], B [out, r]"},
      {"lora.alpha", &c.lora.alpha, above(0), "the adapters' update is scaled by alpha / rank"},
      {"lora.dropout", &c.lora.dropout, closed_open(0, 1),
       "dropout probability on each adapter's input while training (PEFT's lora_dropout)"},
      {"lora.targets", &c.lora.targets, kLoraTargets, "the projections that get adapters"},

      {"optim.type", &c.optim.type, kAny,
       "adamw, or galore_adamw: the blocks' attention and MLP matrices keep Adam's moments in a "
       "rank-r subspace of their gradient ([galore]; embeddings, norms and the head take AdamW)"},
      {"optim.beta1", &c.optim.beta1, closed_open(0, 1), "AdamW beta1"},
      {"optim.beta2", &c.optim.beta2, closed_open(0, 1), "AdamW beta2"},
      {"optim.eps", &c.optim.eps, above(0), "AdamW epsilon"},
      {"optim.weight_decay", &c.optim.weight_decay, at_least(0),
       "decoupled weight decay (matrices only; norms are not decayed)"},
      {"optim.grad_clip", &c.optim.grad_clip, at_least(0),
       "clip the global gradient norm to this (0: off)"},
      {"optim.state_dtype", &c.optim.state_dtype, kAny,
       "dtype of AdamW's moments (and, with optim.master_dtype = auto, of the master weights "
       "and gradient shards; bf16: no offload; int8: the moments of matrices of 4096 values or "
       "more 8-bit in blocks of 256 as bitsandbytes' AdamW8bit, GaLore's projected moments too)"},
      {"optim.master_dtype", &c.optim.master_dtype, kAny,
       "dtype of the master weights and gradient shards: auto (bf16 when state_dtype = bf16, "
       "else fp32), fp32, or bf16 (2 bytes each instead of 4; with either state_dtype, no "
       "offload)"},
      {"optim.bf16_rounding", &c.optim.bf16_rounding, kAny,
       "how an update is rounded into bf16 master weights: stochastic (unbiased, so updates "
       "below half a bf16 step still count on average) or nearest (such updates are lost)"},
      {"optim.update", &c.optim.update, kAny,
       "step: every update after the whole backward; per_layer: each unit's as soon as its "
       "gradients are final in the backward of the step's last micro-batch"},
      {"optim.per_layer_clip", &c.optim.per_layer_clip, kAny,
       "optim.grad_clip under per_layer updates: unit (each unit's gradient clipped to "
       "grad_clip / sqrt(units), so the global norm stays within grad_clip), previous_norm "
       "(the global clip factor of the previous step's norm), or none"},

      {"galore.rank", &c.galore.rank, kPositive,
       "rank r of the subspace (at most the smaller side of every block matrix)"},
      {"galore.update_proj_gap", &c.galore.update_proj_gap, kPositive,
       "steps between two refreshes of a matrix's subspace"},
      {"galore.scale", &c.galore.scale, above(0),
       "the projected-back step is multiplied by this (galore-torch's scale)"},
      {"galore.projector", &c.galore.projector, kAny,
       "svd: the exact top-r singular vectors (an eigen-decomposition of the n x n Gram matrix "
       "in float64 on the host: slow for wide matrices); randomized: a range finder of a few "
       "GEMMs on the gradient's device"},
      {"galore.oversampling", &c.galore.oversampling, at_least(0),
       "randomized: sketch columns beyond the rank"},
      {"galore.power_iterations", &c.galore.power_iterations, closed(0, 16),
       "randomized: power iterations that sharpen the sketch (one or two suffice; each is a "
       "host stage more per refresh)"},
      {"galore.moments_on_refresh", &c.galore.moments_on_refresh, kAny,
       "at a refresh, keep the moments as they are (galore-torch), project them into the new "
       "subspace, or reset them"},
      {"galore.stagger", &c.galore.stagger, kAny,
       "spread the refreshes over the gap, a few matrices per step (false: every matrix at "
       "once every update_proj_gap steps, as galore-torch)"},
      {"galore.refresh", &c.galore.refresh, kAny,
       "pipelined: a refresh runs one stage a step, its float64 host factorisations on a worker "
       "thread, and its projector (of the gradient where it began) is installed a few steps "
       "later; inline: within the step, the GPU idle while the host factorises (galore-torch)"},
      {"galore.precision", &c.galore.precision, kAny,
       "the operands of the per-step projections: bf16 (every device; galore-torch's in a bf16 "
       "run, about twice TF32's speed on a GPU), tf32 (a GPU's tensor cores; the CPU uses fp32) "
       "or fp32; sums in fp32 always. The range finder's products use TF32 on a GPU unless fp32"},
      {"galore.profile", &c.galore.profile, kAny,
       "time GaLore's GPU work with CUDA events: metrics.jsonl's galore_profile holds the "
       "milliseconds per step of refreshes, projections and moments"},

      {"parallel.offload", &c.parallel.offload, kAny,
       "what lives in host memory instead of the device: nothing, the optimizer state, or the "
       "parameters too"},
      {"parallel.cp", &c.parallel.cp, at_least(1),
       "context-parallel ranks: each sequence is split over them and attention runs as a ring "
       "(must divide the number of ranks; the rest are data-parallel)"},
      {"parallel.dp_shard", &c.parallel.dp_shard, at_least(0),
       "data-parallel ranks of one replica, which ZeRO-3 shards the weights over; the replicas "
       "sum their gradients once per step (hybrid sharding). 0: the ranks of one node / cp "
       "(every rank when the nodes differ)"},
      {"parallel.node_ranks", &c.parallel.node_ranks, at_least(0),
       "ranks per node, as blocks of consecutive ranks (0: the ranks that share memory); for "
       "tests that place one machine's ranks as if on several nodes"},
      {"parallel.replica_galore_projection", &c.parallel.replica_galore_projection, kAny,
       "with GaLore and several replicas: its projected matrices cross the replicas as their "
       "rank-r projections (grad_norm counts them so); false: as whole gradient shards"},
      {"parallel.timeout_s", &c.parallel.timeout_s, above(0),
       "seconds a collective may wait for the other ranks before the run stops with an error"},
      {"parallel.device", &c.parallel.device, kAny,
       "where the model runs, one GPU per rank (auto: the GPUs when every node has one for each "
       "of its ranks, else the CPU)"},
      {"parallel.gpu_mem_limit", &c.parallel.gpu_mem_limit, kSize,
       "cap on each rank's GPU memory, e.g. 24GiB to behave like a consumer card (0: the whole "
       "card)"},

      {"ckpt.every", &c.ckpt.every, at_least(0), "save every N steps (0: only at the end)"},
      {"ckpt.keep", &c.ckpt.keep, at_least(1), "committed checkpoints to keep"},
      {"ckpt.final", &c.ckpt.final, kAny,
       "save a checkpoint after the last step (benchmarks turn it off)"},
      {"ckpt.async", &c.ckpt.async, kAny,
       "save in the background: training goes on once the state is copied to host memory, a "
       "thread writes the files, and the step is committed when every rank's is on disk"},

      {"fp8.enabled", &c.fp8.enabled, kAny,
       "run the blocks' linears (fp8.linears) through FP8 GEMMs while training; the head, "
       "norms and attention stay in the compute dtype"},
      {"fp8.recipe", &c.fp8.recipe, kAny,
       "delayed: each tensor's scale from the max of its last amax_history_len amaxes "
       "(TransformerEngine's DelayedScaling); current: from the tensor's own amax at each cast"},
      {"fp8.amax_history_len", &c.fp8.amax_history_len, kPositive,
       "steps of amax history a delayed scale looks back over"},
      {"fp8.margin", &c.fp8.margin, at_least(0),
       "scale = fp8 max / amax / 2^margin: headroom against growth between updates"},
      {"fp8.linears", &c.fp8.linears, kLoraTargets, "the block projections that run in FP8"},
      {"fp8.gather_weights", &c.fp8.gather_weights, kAny,
       "under ZeRO-3, gather the trained weights of the FP8 linears as E4M3 bytes with their "
       "scale (half of bf16's bytes) when the recipe is delayed; false: in bf16 (fp32 on the CPU)"},

      // [monitor]: progress, health (doc/health.md) and the guards against silent failures.
      {"monitor.log_every", &c.monitor.log_every, at_least(1),
       "print a progress line every N steps, and write the health member of metrics.jsonl "
       "(metrics.jsonl gets every step)"},
      {"monitor.health", &c.monitor.health, kAny,
       "gradient health (non-finite values, norms per unit, bf16 underflow and overflow), "
       "rank times, link traffic and GPU sensors in metrics.jsonl every log_every steps"},
      {"monitor.on_divergence", &c.monitor.on_divergence, kAny,
       "what a loss spike does: warn, skip_batch (its update is not applied) or rollback "
       "(reload the last checkpoint, lower the LR, skip the batch)"},
      {"monitor.spike_window", &c.monitor.spike_window, at_least(2),
       "recent losses the spike z-score is computed over"},
      {"monitor.spike_z", &c.monitor.spike_z, above(0),
       "a loss more than this many standard deviations above the window's mean is a spike"},
      {"monitor.max_skipped_steps", &c.monitor.max_skipped_steps, at_least(1),
       "consecutive steps with non-finite gradients (each skipped) before the run is diverging"},
      {"monitor.max_rollbacks", &c.monitor.max_rollbacks, at_least(0),
       "rollbacks a run may make before it stops with an error"},
      {"monitor.rollback_lr_factor", &c.monitor.rollback_lr_factor, closed(0, 1),
       "a rollback multiplies the learning rate by this (again on a rollback while lowered)"},
      {"monitor.rollback_lr_steps", &c.monitor.rollback_lr_steps, at_least(0),
       "steps past the checkpoint a rollback returns to that run with the lowered learning rate "
       "(0: the rest of the run)"},
      {"monitor.slow_rank_factor", &c.monitor.slow_rank_factor, above(1),
       "a rank busier than this times the others' median per step is named as slow"},
      {"monitor.check_recompute_every", &c.monitor.check_recompute_every, at_least(0),
       "compare each block's recomputed forward with the original every N steps "
       "(activation checkpointing; 0: never)"},
      {"monitor.check_replicas_every", &c.monitor.check_replicas_every, at_least(0),
       "compare the checksums of replicated state tensors across ranks every N steps (0: never)"},
      {"monitor.tensorboard", &c.monitor.tensorboard, kPath,
       "also write every number of metrics.jsonl as TensorBoard scalars (tag: the member's path "
       "joined by '/') into event files in this directory, for `tensorboard --logdir` (rank 0; "
       "a resumed run starts a new file that replaces the steps after its checkpoint; empty: "
       "none)"},
  };
}

namespace {

// The shortest text that reads back as the same value ("0.003", not 0.0030000000000000001).
template <class T>
std::string text_of(const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else if constexpr (std::is_enum_v<T>) {
    return std::string(enum_name(value));
  } else {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
    return std::string(buf, end);
  }
}

// A number spelled exactly (the whole text, no spaces): from_chars, which takes "3e-3" and,
// for unsigned types, no sign.
template <class T>
T number_from(const std::string& key, const std::string& text) {
  T value{};
  const char* first = text.data();
  const char* last = first + text.size();
  auto [end, ec] = std::from_chars(first, last, value);
  if (ec == std::errc::result_out_of_range)
    fail("config key '", key, "': value '", text, "' is out of range");
  if (ec != std::errc() || end != last || text.empty()) {
    if constexpr (std::is_integral_v<T>)
      fail("config key '", key, "': value '", text, "' is not ",
           std::is_signed_v<T> ? "an integer" : "a non-negative integer");
    else
      fail("config key '", key, "': value '", text, "' is not a number");
  }
  return value;
}

// The spellings Boost.Program_options took for a bool.
bool bool_from(const std::string& key, const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "0" || lower == "no" || lower == "off") return false;
  fail("config key '", key, "': value '", text, "' is not true or false");
}

// A number's rule: "positive", ">= 0", "> 0", "[0, 1)", "[0, 1]"; empty for none.
std::string bound_text(const KeyRule& r) {
  std::string text;
  switch (r.kind) {
    case KeyRule::Kind::positive:
      text = "positive";
      break;
    case KeyRule::Kind::at_least:
      text = ">= ";
      text += text_of(r.lo);
      break;
    case KeyRule::Kind::above:
      text = "> ";
      text += text_of(r.lo);
      break;
    case KeyRule::Kind::closed_open:
    case KeyRule::Kind::closed:
      text = "[";
      text += text_of(r.lo) + ", " + text_of(r.hi);
      text += r.kind == KeyRule::Kind::closed ? "]" : ")";
      break;
    default:
      break;
  }
  return text;
}

bool within(const KeyRule& r, double v) {
  switch (r.kind) {
    case KeyRule::Kind::positive:
      return v > 0;
    case KeyRule::Kind::at_least:
      return v >= r.lo;
    case KeyRule::Kind::above:
      return v > r.lo;
    case KeyRule::Kind::closed_open:
      return v >= r.lo && v < r.hi;
    case KeyRule::Kind::closed:
      return v >= r.lo && v <= r.hi;
    default:
      return true;
  }
}

// Markdown table cells: a `|` would end the cell.
std::string cell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

}  // namespace

std::string ConfigKey::text() const {
  return std::visit([](auto* field) { return text_of(*field); }, field);
}

void ConfigKey::set(const std::string& text) const {
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<T, std::string>)
          *field = text;
        else if constexpr (std::is_same_v<T, bool>)
          *field = bool_from(name, text);
        else if constexpr (std::is_enum_v<T>)
          *field = enum_from_config<T>(name, text);
        else
          *field = number_from<T>(name, text);
      },
      field);
}

void ConfigKey::check() const {
  if (rule.kind == KeyRule::Kind::size) {
    parse_bytes(text(), name);
    return;
  }
  if (rule.kind == KeyRule::Kind::lora_targets) {
    projections_from_names(text(), name);
    return;
  }
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
          // from_chars takes "inf" and "nan", which no setting means (and NaN passes no
          // comparison a bound could make: "nan must be > 0" would be the wrong complaint).
          if constexpr (std::is_floating_point_v<T>)
            if (!std::isfinite(*field))
              fail("config key '", name, "': value ", text(), " is not a finite number");
          if (within(rule, static_cast<double>(*field))) return;
          const bool range =
              rule.kind == KeyRule::Kind::closed_open || rule.kind == KeyRule::Kind::closed;
          fail("config key '", name, "': value ", text(), range ? " must lie in " : " must be ",
               bound_text(rule));
        }
      },
      field);
}

std::string ConfigKey::allowed() const {
  switch (rule.kind) {
    case KeyRule::Kind::path:
      return "a path";
    case KeyRule::Kind::size:
      return "bytes, with an optional unit: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB";
    case KeyRule::Kind::lora_targets: {
      std::string names = lora_target_names(lora_targets_from_names("all"));
      for (size_t comma = names.find(','); comma != std::string::npos;
           comma = names.find(',', comma + 2))
        names.replace(comma, 1, ", ");
      return "all, or a comma-separated list of " + names;
    }
    default:
      break;
  }
  return std::visit(
      [&](auto* field) -> std::string {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<T, bool>)
          return "true, false";
        else if constexpr (std::is_enum_v<T>)
          return enum_name_list<T>();
        else if constexpr (std::is_same_v<T, std::string>)
          return "any text";
        else if constexpr (std::is_integral_v<T>)
          return rule.kind == KeyRule::Kind::any
                     ? (std::is_signed_v<T> ? "an integer" : "an integer >= 0")
                     : bound_text(rule);
        else
          return rule.kind == KeyRule::Kind::any ? "a number" : bound_text(rule);
      },
      field);
}

std::string config_keys_markdown() {
  TrainConfig defaults;
  std::ostringstream out;
  out << "| key | default | allowed | meaning |\n|---|---|---|---|\n";
  for (const ConfigKey& key : config_keys(defaults)) {
    const std::string value = key.text();
    // An empty default, or one whose spaces matter, would not show in a table cell.
    const bool padded = !value.empty() && (value.front() == ' ' || value.back() == ' ');
    const std::string shown = value.empty() ? "(empty)" : padded ? "\"" + value + "\"" : value;
    out << "| `" << key.name << "` | " << cell(shown) << " | " << cell(key.allowed()) << " | "
        << cell(key.doc) << " |\n";
  }
  return out.str();
}

}  // namespace frugal
