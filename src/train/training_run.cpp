// Assembling a run from its configuration.
#include "train/training_run.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "config/config_keys.h"
#include "core/checked.h"
#include "core/log.h"
#include "model/llama_mlp.h"
#include "monitor/metrics.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/galore_adamw.h"
#include "parallel/fp8_encoding.h"
#include "parallel/nccl_comm.h"
#include "parallel/ring_attention.h"
#include "parallel/zero3_state.h"
#include "plan/memory_plan.h"
#include "train/run_state.h"
#include "train/same_config.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

void check_token_ids(const TokenFile& tokens, const std::string& path, int64_t vocab_size) {
  const TokenView view = tokens.view();
  int64_t largest = -1, smallest = 0;
#pragma omp parallel for reduction(max : largest) reduction(min : smallest)
  for (int64_t i = 0; i < int64_t(view.size); ++i) {
    largest = std::max<int64_t>(largest, view[uint64_t(i)]);
    smallest = std::min<int64_t>(smallest, view[uint64_t(i)]);
  }
  if (smallest >= 0 && largest < vocab_size) return;
  const int64_t bad = smallest < 0 ? smallest : largest;
  for (uint64_t i = 0; i < view.size; ++i)
    if (view[i] == bad)
      fail("token file '", path, "' holds the id ", bad, " at token ", i,
           ", outside the model's vocabulary [0, ", vocab_size,
           ") (config key 'model.vocab_size'): the file is damaged or was made with another "
           "tokenizer");
}

// The block of a block parameter's name ("model.layers.3.mlp.up_proj.weight": 3), or -1.
int64_t block_layer_of(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  const size_t end = name.find('.', prefix.size());
  if (end == std::string::npos || end == prefix.size()) return -1;
  int64_t layer = 0;
  for (size_t i = prefix.size(); i < end; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    layer = layer * 10 + (name[i] - '0');
  }
  return layer;
}

// The checkpoint directory must take files before any work is done: found at the first save,
// an unwritable path costs the steps before it. Every rank writes there (its rank file).
// FP8 GEMMs need sm_89+ (cuBLASLt's FP8 kernels; the casts' hardware conversion), and
// cuBLASLt's FP8 layouts need every GEMM dimension a multiple of 16. The CPU emulates FP8 on
// any shape.
#ifdef FRUGAL_HAVE_CUDA
void check_fp8_device(const TrainConfig& c, const DeviceContext& gpu) {
  const int cc = gpu.compute_capability();
  if (cc < 89)
    fail(
        "config key 'fp8.enabled': FP8 needs a GPU of compute capability 8.9 or newer (sm_89+: "
        "RTX 40xx, L4, H100, H200); GPU ",
        gpu.device(), " is sm_", cc, ". Run with fp8.enabled = false");
  const LlamaConfig& m = c.model;
  const int64_t head_dim = m.attention_head_dim();
  const int64_t tokens = c.train.micro_batch_size * c.train.seq_len / c.parallel.cp;
  const std::pair<const char*, int64_t> dims[] = {
      {"model.hidden_size", m.hidden_size},
      {"model.intermediate_size", m.intermediate_size},
      {"model.num_attention_heads x head dimension", m.num_attention_heads * head_dim},
      {"model.num_key_value_heads x head dimension", m.num_key_value_heads * head_dim},
      {"train.micro_batch_size x train.seq_len / parallel.cp (tokens)", tokens}};
  for (const auto& [what, value] : dims)
    if (value % 16 != 0)
      fail("config key 'fp8.enabled': FP8 GEMMs on a GPU need ", what, " = ", value,
           " to be a multiple of 16");
}
#endif

// One run at a time in out_dir: rank 0 locks it, and every rank learns the outcome before any
// of them writes there. A refusal is rank 0's error, which names the holder.
std::unique_ptr<RunDirLock> lock_out_dir(const std::string& out_dir, Comm& world) {
  std::unique_ptr<RunDirLock> lock;
  std::string refused;
  if (world.rank() == 0) {
    try {
      lock = std::make_unique<RunDirLock>(out_dir);
    } catch (const Error& e) {
      refused = e.what();
      if (refused.empty()) refused = "cannot lock train.out_dir '" + out_dir + "'";
    }
  }
  const bool any = world.all_reduce_max(refused.empty() ? 0 : 1) > 0;
  if (!refused.empty()) throw Error(refused);
  if (any) {
    // Rank 0's message is the one that says why, and its abort ends this rank: give it that
    // moment rather than racing it to the terminal.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    fail("rank ", world.rank(), ": rank 0 could not lock train.out_dir '", out_dir,
         "' (its message says why)");
  }
  return lock;
}

void check_writable_checkpoints(const fs::path& ckpt_dir, int rank) {
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);
  if (ec)
    fail("config key 'train.out_dir': cannot create the checkpoint directory '", ckpt_dir.string(),
         "': ", ec.message());
  const fs::path probe = ckpt_dir / (".write_test_rank_" + std::to_string(rank));
  {
    std::ofstream out(probe);
    out << "frugal\n";
    out.flush();
    if (!out)
      fail("config key 'train.out_dir': cannot write checkpoints into '", ckpt_dir.string(), "' (",
           std::strerror(errno), ")");
  }
  fs::remove(probe, ec);
}

}  // namespace

TrainingRun::TrainingRun(const TrainConfig& config_in) : config(config_in) {
  TrainConfig& c = config;
  // Starting from a Hugging Face model: its shape wins over [model], its weights over init.
  if (!c.model_hf_path.empty()) {
    hf.emplace(c.model_hf_path);
    const RopeScaling extension = c.model.rope_scaling;
    c.model = hf->config();
    // [model] rope_scaling on a Hugging Face model: a context extension (long-context.md).
    if (extension.type != RopeScalingType::none)
      c.model = with_context_extension(c.model, extension);
    for (const ConfigKey& key : config_keys(c))
      if (key.section() == "model" && key.name != "model.hf_path")
        c.resolved[key.name] = key.text();
    c.validate_model_dependent();
  }
  MeshShape shape;
  shape.cp = c.parallel.cp;
  shape.dp_shard = c.parallel.dp_shard;
  shape.node_ranks = c.parallel.node_ranks;
  host_mesh = make_mesh(shape, c.parallel.timeout_s);
  check_same_config(*host_mesh.world, c.resolved);
  out_dir_lock = lock_out_dir(c.train.out_dir, *host_mesh.world);
  use_gpu = decide_gpu(c.parallel.device, *host_mesh.world, "config key 'parallel.device'");

  // --- data ----------------------------------------------------------------------------------
  const fs::path data_dir(c.data.dir);
  for (const char* f : {"train.tok", "val.tok"})
    if (!fs::exists(data_dir / f))
      fail("config key 'data.dir': '", c.data.dir, "' has no ", f,
           " (make it with `frugal prepare TEXT... --out ", c.data.dir, "`)");
  const std::string data_tokenizer = find_tokenizer(c.data.dir);
  if (data_tokenizer.empty())
    fail("config key 'data.dir': '", c.data.dir, "' has no tokenizer.model or tokenizer.json",
         " (make it with `frugal prepare TEXT... --out ", c.data.dir, "`)");
  train_tokens = std::make_unique<TokenFile>((data_dir / "train.tok").string());
  val_tokens = std::make_unique<TokenFile>((data_dir / "val.tok").string());
  tokenizer = std::make_unique<Tokenizer>(data_tokenizer);
  if (int64_t(train_tokens->header().vocab_size) > c.model.vocab_size)
    fail("config key 'model.vocab_size': ", c.model.vocab_size,
         " is smaller than the vocabulary of '", c.data.dir, "' (",
         train_tokens->header().vocab_size, ")");
  // Every id must index the embedding: a damaged or foreign file is named here, not by a bad
  // read inside the model.
  check_token_ids(*train_tokens, (data_dir / "train.tok").string(), c.model.vocab_size);
  check_token_ids(*val_tokens, (data_dir / "val.tok").string(), c.model.vocab_size);
  SamplerConfig sampler_config;
  sampler_config.seq_len = c.train.seq_len;
  sampler_config.micro_batch_size = c.train.micro_batch_size;
  sampler_config.seed = c.train.seed;
  // Ranks of one cp group read the same sequences; the dp groups read different ones.
  sampler_config.rank = host_mesh.dp_rank;
  sampler_config.world = host_mesh.dp_size;
  data = training_data(c, *train_tokens, *val_tokens, host_mesh.world->rank());
  sampler = std::make_unique<BatchSampler>(train_tokens->view(), sampler_config, data.train_targets,
                                           data.train_windows.get());

  // --- device, model, shards, optimizer --------------------------------------------------------
  check_writable_checkpoints(fs::path(c.train.out_dir) / "ckpt", host_mesh.world->rank());
  // The GPU (one per rank, picked by the node-local rank) and its communicator: NCCL for the
  // weights and gradients, MPI underneath for host values.
  memory = std::make_unique<RunMemory>(c.parallel, use_gpu, host_mesh.local_rank);
  // The size keys alone, before any table or tensor is made from them: the parameter list of
  // model.num_hidden_layers = 10^9 would fill the host on its own.
  size_t device_bytes = 0;
#ifdef FRUGAL_HAVE_CUDA
  if (memory->gpu) device_bytes = memory->gpu->device_memory().stats().limit_bytes;
#endif
  check_memory_floor(memory_floor(c, host_mesh.shard->size(), host_mesh.cp_size, use_gpu),
                     size_t(mpi_node_size()), available_host_bytes(), device_bytes);
#ifdef FRUGAL_HAVE_CUDA
  if (use_gpu) gpu_mesh = make_nccl_mesh(host_mesh, *memory->gpu, c.parallel.timeout_s);
#endif
  model = std::make_unique<LlamaModel>(c.model);
  model->set_mlp_chunk_tokens(c.train.mlp_chunk_tokens);
  model->set_loss_chunk_rows(c.train.loss_chunk_tokens);
  if (c.train.activation_offload == ActivationOffload::inputs)
    model->set_input_offload(memory->activation_inputs.get());
  if (mesh().cp_size > 1) {
    ring = ring_attention_operator(*mesh().cp);
    model->set_attention(&ring);
  }
  if (c.train.type != TrainType::full) {
    lora.rank = c.lora.rank;
    lora.alpha = c.lora.alpha;
    lora.targets = lora_targets_from_names(c.lora.targets);
    lora.dropout = c.lora.dropout;
    lora.seed = c.train.seed;
    model->set_lora(&lora);
  }
  if (c.fp8.enabled) {
#ifdef FRUGAL_HAVE_CUDA
    if (use_gpu) check_fp8_device(c, *memory->gpu);
#endif
    Fp8Settings settings;
    settings.enabled = true;
    settings.recipe = c.fp8.recipe;
    settings.amax_history_len = c.fp8.amax_history_len;
    settings.margin = c.fp8.margin;
    settings.linears = projections_from_names(c.fp8.linears, "fp8.linears");
    fp8 = std::make_unique<Fp8Scaling>(settings, c.model.num_hidden_layers, memory->activations());
    model->set_fp8(fp8.get());
  }
  Zero3Init init;
  if (hf) {
    // Each rank reads only its own rows of each tensor (one tensor's rows at a time): host
    // memory stays near this rank's share, never the whole model. Adapters start from the seed.
    init.load_rows = [this](const std::string& name, int64_t first, int64_t last, Tensor& rows) {
      if (is_lora_a(name) || is_lora_b(name)) return false;
      hf->read_rows_into(name, first, last, rows);
      return true;
    };
  }
  // QLoRA: the frozen projections of every block in 4 bits (as fsdp_qlora quantizes them).
  const auto projection = [](const ParamSpec& p) {
    return p.shape.size() == 2 && is_block_projection(p.name);
  };
  // LoRA with FP8: the frozen base projections the FP8 GEMMs read are kept and gathered as E4M3
  // bytes with a per-tensor scale (half of bf16's bytes); the GEMM's cast of the decoded weight
  // gives back the same codes under current scaling.
  if (c.train.type == TrainType::lora && fp8)
    init.encoding = [this](const ParamSpec& p) -> std::unique_ptr<WeightEncoding> {
      const int index = block_projection_index(p.name);
      if (p.shape.size() != 2 || index < 0 || !fp8->covers(index)) return nullptr;
      return std::make_unique<Fp8Encoding>();
    };
  // Full training with FP8 under delayed scaling: the trained projections the FP8 GEMMs read are
  // gathered as E4M3 codes cast with their weight slot's scale, which every rank agrees on (the
  // step-end amax reduction). Current scaling would need the whole tensor's amax before each
  // cast, one more collective per gather: those stay in the compute dtype.
  if (fp8 && c.fp8.gather_weights && c.fp8.recipe == Fp8Recipe::delayed)
    init.fp8_gather = [this](const ParamSpec& p) -> std::optional<ops::Fp8Slot> {
      const int index = block_projection_index(p.name);
      const int64_t layer = block_layer_of(p.name);
      if (index < 0 || layer < 0 || !fp8->covers(index)) return std::nullopt;
      return fp8->weight(layer, index);
    };
  if (c.train.type == TrainType::qlora) init.nf4 = projection;
  if (c.train.type == TrainType::hqq_lora) init.hqq = projection;
  const bool bf16_master = c.optim.bf16_master();
  // The replicas of hybrid sharding sum bf16 gradient shards through NCCL; MPI (the CPU's
  // communicator) sums no bf16.
  if (bf16_master && !use_gpu && mesh().dp_replicate > 1)
    fail(
        "config key 'optim.master_dtype': bf16 master weights on the CPU backend need one "
        "replica (parallel.dp_shard = every data-parallel rank, here ",
        mesh().dp_replicate, " replicas): MPI cannot sum their bf16 gradient shards");
  std::vector<UnitSpec> units = lora.enabled() ? lora_units(c.model, lora) : llama_units(c.model);
  // Hybrid sharding: ZeRO-3 within a replica; the replicas sum their gradient shards, GaLore's
  // projected matrices as their projections (the optimizer sums those).
  const bool galore_on = c.optim.type == OptimizerType::galore_adamw;
  const bool projected_replica_sums =
      galore_on && c.parallel.replica_galore_projection && mesh().dp_replicate > 1;
  std::optional<GaloreConfig> galore;
  if (galore_on) {
    galore = galore_config(c);
    galore->projected_replica_sums = projected_replica_sums;
    // Offloaded, the products run on the host: bf16 operands gain nothing there and pay for
    // their conversions (and f32 copies), which at a 7B shape are seconds a step.
    if (galore->precision == GaloreProjectionPrecision::bf16 && use_gpu &&
        c.parallel.offload != Offload::none && world().rank() == 0)
      log_info(
          "galore: with parallel.offload the projections run on the host, where "
          "galore.precision = bf16 only adds conversions: fp32 is as fast there");
  }
  check_memory_plan(units, projection, galore);
  Zero3Replicas replicas;
  replicas.comm = mesh().replica.get();
  if (use_gpu) replicas.host_comm = host_mesh.replica.get();
  if (projected_replica_sums)
    replicas.summed_elsewhere = [](const ParamSpec& p) {
      return p.trainable && galore_projects(p.name, p.shape);
    };
  params = std::make_unique<Zero3Parameters>(
      std::move(units), *mesh().shard,
      Zero3Arenas{memory->params.get(), memory->grads.get(), memory->gathered.get(),
                  memory->copies.get(), bf16_master ? DType::bf16 : DType::f32},
      c.train.seed, static_cast<float>(c.train.init_std), true, init, replicas);
#ifdef FRUGAL_HAVE_CUDA
  // The frozen weights' fp32 masters were made on the GPU and dropped once copied to bf16; the
  // allocator would keep their blocks (a 7B embedding's 0.5 GB) in size classes no later tensor
  // asks for: give them back (the memory plan counts the start-up's reservation apart).
  if (memory->gpu) memory->gpu->device_memory().trim();
#endif
  AdamWConfig adamw_config;
  adamw_config.beta1 = c.optim.beta1;
  adamw_config.beta2 = c.optim.beta2;
  adamw_config.eps = c.optim.eps;
  adamw_config.weight_decay = c.optim.weight_decay;
  adamw_config.grad_clip = c.optim.grad_clip;
  adamw_config.moments = c.optim.state_dtype == StateDType::bf16 ? DType::bf16 : DType::f32;
  adamw_config.bf16_stochastic = c.optim.bf16_rounding == Bf16Rounding::stochastic;
  adamw_config.rounding_seed = c.train.seed;
  adamw_config.int8_state = c.optim.state_dtype == StateDType::int8;
  if (galore) {
    optimizer = std::make_unique<GaloreAdamW>(params->trainable(), adamw_config, *galore,
                                              *memory->optimizer);
  } else {
    optimizer = std::make_unique<AdamW>(params->trainable(), adamw_config, *memory->optimizer);
  }
  if (c.optim.update == UpdateTiming::per_layer) {
    // Hybrid sharding sums each unit's gradient shards across the replicas after its
    // reduce-scatter, and GaLore's projected sums cross them in begin_step: neither follows the
    // units one by one yet.
    if (mesh().dp_replicate > 1)
      fail("config key 'optim.update': per_layer works within one replica (", mesh().dp_replicate,
           " replicas here: parallel.dp_shard = ", c.parallel.dp_shard,
           "); set parallel.dp_shard = 0 or to every data-parallel rank");
    per_layer = std::make_unique<PerLayerUpdates>(c.optim.per_layer_clip, c.optim.grad_clip);
  }
  schedule = {c.train.lr, c.train.warmup_steps, c.train.steps, c.train.min_lr_ratio};

  // --- checkpoints: every stateful part, by name ------------------------------------------------
  states.push_back(std::make_unique<ModelShapeState>(c.model));
  states.push_back(std::make_unique<Zero3State>(*params));
  states.push_back(std::make_unique<ResolvedConfigState>(c.resolved));
  std::vector<CheckpointManager::Part> parts = {{"model", states[0].get()},
                                                {"weights", states[1].get()},
                                                {"optim", optimizer.get()},
                                                {"sampler", sampler.get()},
                                                {"config", states[2].get()}};
  if (fp8) parts.push_back({"fp8", fp8.get()});
  if (per_layer) parts.push_back({"per_layer", per_layer.get()});
  // The rank files are one replica's (a checkpoint of ZeRO-3 over its ranks, which any mesh
  // resumes); the other replicas hold the same rows and write nothing.
  Comm& shard = *mesh().shard;
  Arena* staging = checkpoint_staging(CheckpointManager::state_bytes(parts, shard.rank()));
  checkpoints = std::make_unique<CheckpointManager>(
      CheckpointDir((fs::path(c.train.out_dir) / "ckpt").string()), shard.rank(), shard.size(),
      [&world = world()](bool ok) { return world.all_reduce_max(ok ? 0 : 1) == 0; },
      std::move(parts), c.ckpt.keep, staging, mesh().replica_rank);
  if (staging)
    log_info("checkpoints: ", mib(memory->staging->stats().in_use_bytes), " of ",
             memory->staging->name(), " reserved for the copies");

  if (hf) {
    log_info("weights: ", c.model_hf_path, " (", c.model.parameter_count(), " parameters)");
    const std::string hf_tokenizer = hf->tokenizer_path();
    if (!hf_tokenizer.empty() &&
        (fs::path(hf_tokenizer).filename() != fs::path(tokenizer->path()).filename() ||
         fs::file_size(hf_tokenizer) != fs::file_size(tokenizer->path())))
      log_warn("the tokenizer of ", c.data.dir, " differs from ", hf_tokenizer,
               "; prepare the data with `frugal prepare --tokenizer ", hf_tokenizer, "`");
  }
}

TrainingRun::~TrainingRun() = default;

void TrainingRun::check_memory_plan(const std::vector<UnitSpec>& units,
                                    const std::function<bool(const ParamSpec&)>& projection,
                                    const std::optional<GaloreConfig>& galore) {
  const TrainConfig& c = config;
  PlanSettings settings;
  settings.ranks = mesh().shard->size();  // ZeRO-3 divides the state among one replica's ranks
  settings.gpu = use_gpu;
  settings.offload = c.parallel.offload;
  settings.state = c.optim.state_dtype;
  settings.master = c.optim.master_dtype;
  settings.galore = galore;
  if (c.train.type == TrainType::qlora || c.train.type == TrainType::hqq_lora)
    settings.four_bit = projection;
  settings.four_bit_hqq = c.train.type == TrainType::hqq_lora;
  if (fp8) settings.fp8_gathered = fp8_gathered_weights(c, settings.ranks, use_gpu);
  settings.activation_inputs = offloaded_input_bytes(c, mesh().cp_size, use_gpu);
  settings.checkpoint_staging = c.ckpt.stages_saves();
  const MemoryPlan plan = plan_memory(units, settings);
  const std::string advice =
      ": more ranks per replica (ZeRO-3 divides the state among them; parallel.dp_shard = all "
      "data-parallel ranks shards it over every node), parallel.offload = optimizer or params "
      "on GPUs, or train.type = lora or qlora (a frozen base has no gradients or moments) would "
      "lower it";
  // Every rank of a node draws on the same host memory.
  const size_t node_ranks = size_t(mpi_node_size());
  const size_t available = available_host_bytes();
  // Said before anything is allocated: a 70B base takes tens of GiB of (pinned) host memory.
  if (world().rank() == 0)
    log_info("memory plan per rank: host ", gib(plan.host), ", ",
             use_gpu ? "GPU " + gib(plan.device) : std::string("no GPU"), " (", describe(plan),
             ", before activations)",
             plan.checkpoint_staging > 0
                 ? ", and " + gib(plan.checkpoint_staging) +
                       " of host memory for asynchronous checkpoint copies where it fits"
                 : std::string(),
             "; this node: ", node_ranks, " rank(s), ",
             available > 0 ? gib(available) + " of host memory available" : "host memory unknown");
  if (available > 0 && plan.activation_inputs > 0 && plan.host * node_ranks > available)
    fail("config key 'train.activation_offload': inputs needs ", gib(plan.activation_inputs),
         " of host memory per rank for the blocks' inputs (", c.model.num_hidden_layers - 1,
         " blocks x ", local_tokens(c, mesh().cp_size), " tokens x ", c.model.hidden_size,
         "), and with the run's state (", node_ranks, " rank(s) x ", describe(plan),
         ") the node needs ", gib(plan.host * node_ranks), " of the ", gib(available),
         " available: shorter sequences, more context-parallel ranks (parallel.cp) or "
         "train.activation_offload = none would lower it");
  if (available > 0 && plan.host * node_ranks > available)
    fail("the run's state needs at least ", gib(plan.host * node_ranks),
         " of host memory on this node (", node_ranks, " rank(s) x ", describe(plan),
         " before activations), and ", gib(available), " is available", advice);
#ifdef FRUGAL_HAVE_CUDA
  const size_t cap = memory->gpu ? memory->gpu->device_memory().stats().limit_bytes : 0;
  if (cap > 0 && plan.device > cap)
    fail("the run's state needs at least ", gib(plan.device), " of GPU memory per rank (",
         describe(plan), " before activations), and the GPU ",
         c.parallel.gpu_mem_limit_bytes() > 0 ? "is capped at " : "has ", gib(cap),
         " (parallel.gpu_mem_limit)", advice);
#endif
}

Arena* TrainingRun::checkpoint_staging(size_t state_bytes) {
  // Each rank of a node stages its own state: together they must leave the host room to work.
  const size_t node_ranks = size_t(mpi_node_size());
  const size_t available = available_host_bytes();
  const bool fits = available == 0 || state_bytes * node_ranks <= available / 10 * 8;
  std::string why;
  if (!config.ckpt.async)
    why = "ckpt.async = false";
  else if (!config.ckpt.stages_saves())
    why =
        "no save is scheduled: ckpt.every = 0 and ckpt.final = false, so only a stop signal saves";
  else if (!fits)
    why = "staging " + mib(state_bytes) + " per rank for " + std::to_string(node_ranks) +
          " rank(s) on this node needs more than 80 % of the " + mib(available) +
          " of host memory available";
  // Every rank saves alike: one rank without room makes every save synchronous.
  const bool async = host_mesh.world->all_reduce_max(why.empty() ? 0 : 1) == 0;
  if (async) {
    log_info("checkpoints: asynchronous: each save copies this rank's ", mib(state_bytes),
             " of state into ", memory->staging->name(),
             " and a thread writes the file while training goes on");
    return memory->staging.get();
  }
  log_info("checkpoints: synchronous (", why.empty() ? "another rank has no room to stage" : why,
           "): training waits while each save writes ", mib(state_bytes), " per rank");
  return nullptr;
}

int64_t TrainingRun::tokens_per_step() const {
  const int dp = use_gpu ? gpu_mesh.dp_size : host_mesh.dp_size;
  const char* what = "train.micro_batch_size x train.seq_len x train.grad_accum_steps x dp ranks";
  return checked_mul(
      checked_mul(checked_mul(config.train.micro_batch_size, config.train.seq_len, what),
                  config.train.grad_accum_steps, what),
      int64_t{dp}, what);
}

void TrainingRun::log_plan(int64_t start_step) const {
  const TrainConfig& c = config;
  const Mesh& m = use_gpu ? gpu_mesh : host_mesh;
  const bool bf16_state = c.optim.state_dtype == StateDType::bf16;
  const bool int8_state = c.optim.state_dtype == StateDType::int8;
  const std::string moments = int8_state ? "8-bit" : bf16_state ? "bf16" : "fp32";
  const std::string masters =
      c.optim.bf16_master()
          ? "bf16 master weights and gradients (rounded " +
                std::string(enum_name(c.optim.bf16_rounding)) + "), " + moments + " moments"
          : std::string("fp32 master weights") +
                (int8_state ? ", 8-bit moments (optim.state_dtype = int8)" : "");
  log_info(
      "frugal train: model ", c.model.parameter_count(), " parameters (", c.model.num_hidden_layers,
      " layers, hidden ", c.model.hidden_size, ", heads ", c.model.num_attention_heads, "/",
      c.model.num_key_value_heads, ", vocab ", c.model.vocab_size, "); ", m.world->size(),
      " rank(s) = dp ", m.dp_size, " x cp ", m.cp_size, ", ZeRO-3",
      m.dp_replicate > 1
          ? " within each of " + std::to_string(m.dp_replicate) + " replicas (HSDP: dp_replicate " +
                std::to_string(m.dp_replicate) + " x dp_shard " + std::to_string(m.dp_shard) +
                " x cp " + std::to_string(m.cp_size) + ")"
          : std::string(),
      ", offload ", c.parallel.offload, ", ",
      use_gpu ? "GPU (bf16 compute, " : "CPU (fp32 compute, ", masters, ")");
  {
    std::string mesh_line = "mesh: " + m.describe() + "; weights gathered and gradients " +
                            "reduce-scattered over " + std::to_string(m.shard->size()) +
                            " rank(s) (" + link_class_name(m.shard->topology().link()) + ")";
    if (m.dp_replicate > 1)
      mesh_line +=
          std::string("; gradient shards all-reduced over ") + std::to_string(m.dp_replicate) +
          " replicas (" + link_class_name(m.replica->topology().link()) + ")" +
          (c.optim.type == OptimizerType::galore_adamw && c.parallel.replica_galore_projection
               ? ", GaLore's projected matrices as their rank-r projections"
               : "");
    log_info(mesh_line);
  }
  if (lora.enabled()) {
    int64_t adapters = 0;
    for (const UnitSpec& u : params->units())
      for (const ParamSpec& p : u.params)
        if (p.trainable) adapters += shape_numel(p.shape);
    log_info("LoRA: rank ", lora.rank, ", alpha ", c.lora.alpha, " on ",
             lora_target_names(lora.targets), ": ", adapters, " trainable parameters, the ",
             c.model.parameter_count(), " of the base frozen",
             c.train.type == TrainType::qlora      ? ", its block projections in NF4 (QLoRA)"
             : c.train.type == TrainType::hqq_lora ? ", its block projections in HQQ 4-bit"
                                                   : "");
  }
  // The bf16 copies hold, on a GPU, the frozen weights (4-bit rows included) besides the
  // trainable ones' copies.
  const std::string copies =
      memory->copies ? ", weight copies " + mib(memory->copies->stats().in_use_bytes) : "";
  log_info("memory per rank: parameters ", mib(memory->params->stats().in_use_bytes),
           ", gradients ", mib(memory->grads->stats().in_use_bytes), ", optimizer ",
           mib(memory->optimizer->stats().in_use_bytes), copies, ", gathered units up to ",
           mib(2 * params->largest_unit_bytes(
                       dtype_bytes(ops::compute_dtype(memory->gathered->device())))),
           " (two units' weights and gradients)");
  if (c.train.activation_offload == ActivationOffload::inputs)
    log_info("activation offload: the inputs of ", c.model.num_hidden_layers - 1, " blocks (",
             local_tokens(c, m.cp_size), " tokens x ", c.model.hidden_size, " each) wait for the ",
             "backward in ", memory->activation_inputs->name(), ": ",
             mib(offloaded_input_bytes(c, m.cp_size, use_gpu)), " per rank");
  {
    const int64_t tokens = local_tokens(c, m.cp_size);
    const int64_t rows = mlp_chunk_rows(tokens, c.model, c.train.mlp_chunk_tokens);
    if (rows < tokens)
      log_info("MLP in chunks of ", rows, " of the ", tokens, " rows of a micro-batch",
               c.train.mlp_chunk_tokens > 0 ? " (train.mlp_chunk_tokens)" : " (chosen)",
               c.fp8.enabled ? "; with [fp8] only where the MLP has no FP8 linear" : "");
  }
  if (const auto* galore = dynamic_cast<const GaloreAdamW*>(optimizer.get())) {
    const GaloreAdamW::StateBytes b = galore->state_bytes();
    log_info("optimizer state per rank with GaLore (rank ", c.galore.rank, ", ",
             galore->projected_matrices(), " projected matrices): ", mib(b.total()),
             " = projected moments ", mib(b.projected_moments), " + projectors ", mib(b.projectors),
             " + AdamW moments of the other weights ", mib(b.adamw_moments),
             "; AdamW on every weight would hold ", mib(b.adamw_equivalent), " (GaLore's is ",
             int(100.0 * double(b.total()) / double(std::max<size_t>(1, b.adamw_equivalent)) + 0.5),
             " % of it)");
  }
  log_info("data: ", train_tokens->size(), " training tokens, ", val_tokens->size(),
           " validation tokens; ", tokens_per_step(), " tokens per step; steps ", start_step + 1,
           "..", c.train.steps, "; activation checkpointing ",
           checkpoint_policy_name(c.train.activation_checkpointing));
}

}  // namespace frugal
