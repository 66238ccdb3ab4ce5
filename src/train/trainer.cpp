// The training loop on every rank. ZeRO-3 shards the model over all ranks (one rank is the
// degenerate case of the same code); each rank reads its own rows of every global batch.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "ckpt/checkpoint_dir.h"
#include "core/device.h"
#include "ckpt/sharded_reader.h"
#include "core/log.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "parallel/mesh.h"
#include "parallel/nccl_comm.h"
#include "parallel/ring_attention.h"
#include "parallel/zero3_parameters.h"
#include "model/hf_model.h"
#include "model/llama_model.h"
#include "model/lora.h"
#include "model/sampling.h"
#include "monitor/metrics.h"
#include "optim/adamw.h"
#include "ops/ops.h"
#include "optim/lr_schedule.h"
#include "train/train_step.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

// Where each kind of state lives; separate arenas make the per-rank accounting exact.
// On the CPU each is its own arena in host memory (offloaded state is the same memory, counted
// apart, as it is on a GPU). On a GPU each is an accounting domain inside the one capped device
// arena, or inside pinned host memory when offloaded; activations go to the device arena.
struct RunMemory {
  RunMemory(const ParallelConfig& p, bool use_gpu, int local_rank) {
    const Offload offload = p.offload;
    const std::string host = use_gpu ? " (pinned host, offloaded)" : " (host, offloaded)";
    // On a GPU both offload modes move the fp32 master too (the host optimizer updates it).
    const std::string params_name =
        offload == Offload::params || (use_gpu && offload != Offload::none)
            ? "parameter shards" + host
            : "parameter shards";
    const std::string grads_name =
        offload != Offload::none ? "gradient shards" + host : "gradient shards";
    const std::string optimizer_name =
        offload != Offload::none ? "optimizer state" + host : "optimizer state";
    if (!use_gpu) {
      params = std::make_unique<Arena>(params_name, Device::cpu);
      grads = std::make_unique<Arena>(grads_name, Device::cpu);
      optimizer = std::make_unique<Arena>(optimizer_name, Device::cpu);
      gathered = std::make_unique<Arena>("gathered units", Device::cpu);
      return;
    }
#ifdef FRUGAL_HAVE_CUDA
    gpu = std::make_unique<DeviceContext>(local_rank, p.gpu_mem_limit_bytes());
    Arena& device = gpu->device_memory();
    Arena& pinned = gpu->pinned_memory();
    // Offload on a GPU: the fp32 state (master, gradients, moments) in pinned host memory,
    // where AdamW runs on the host; with `params` the bf16 copies too (uploaded when used).
    const bool host_state = offload != Offload::none;
    params = std::make_unique<SubArena>(params_name, host_state ? pinned : device);
    grads = std::make_unique<SubArena>(grads_name, host_state ? pinned : device);
    optimizer = std::make_unique<SubArena>(optimizer_name, host_state ? pinned : device);
    gathered = std::make_unique<SubArena>("gathered units", device);
    copies = std::make_unique<SubArena>(offload == Offload::params
                                            ? "bf16 weight copies (pinned host, offloaded)"
                                            : "bf16 weight copies",
                                        offload == Offload::params ? pinned : device);
    ops::bind_device(gpu.get());
#else
    (void)local_rank;
    fail("config key 'parallel.device': this frugal was built without CUDA");
#endif
  }
  ~RunMemory() {
#ifdef FRUGAL_HAVE_CUDA
    if (gpu) ops::bind_device(nullptr);
#endif
  }
  Arena& activations() {
#ifdef FRUGAL_HAVE_CUDA
    if (gpu) return gpu->device_memory();
#endif
    return host_arena();
  }
  // On a GPU every state arena is a part of the device or pinned arena, which count it all.
  size_t peak_bytes() {
#ifdef FRUGAL_HAVE_CUDA
    if (gpu) return gpu->device_memory().stats().peak_bytes + gpu->pinned_memory().stats().peak_bytes;
#endif
    return activations().stats().peak_bytes + gathered->stats().peak_bytes +
           params->stats().peak_bytes + grads->stats().peak_bytes + optimizer->stats().peak_bytes;
  }
  nlohmann::json report() {
    nlohmann::json r = {{"parameters_bytes", params->stats().in_use_bytes},
                        {"gradients_bytes", grads->stats().in_use_bytes},
                        {"optimizer_bytes", optimizer->stats().in_use_bytes},
                        {"gathered_peak_bytes", gathered->stats().peak_bytes},
                        {"activations_peak_bytes", activations().stats().peak_bytes}};
#ifdef FRUGAL_HAVE_CUDA
    if (gpu) {
      const CachingStats d = gpu->device_memory().caching_stats();
      r["weight_copies_bytes"] = copies->stats().in_use_bytes;
      r["device_peak_bytes"] = d.peak_reserved_bytes;
      r["device_peak_in_use_bytes"] = d.peak_in_use_bytes;
      r["pinned_host_bytes"] = gpu->pinned_memory().stats().in_use_bytes;
    }
#endif
    return r;
  }

#ifdef FRUGAL_HAVE_CUDA
  std::unique_ptr<DeviceContext> gpu;  // first member: outlives every arena inside it
#endif
  std::unique_ptr<Arena> params, grads, optimizer, gathered, copies;
};

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / 1048576.0);
  return buf;
}

// Every rank must run the same configuration: a rank with another seed or shape would
// silently train a different model, or hang in a collective of another size.
void check_same_config(Comm& world, const TrainConfig& c) {
  const std::string mine = nlohmann::json(c.resolved).dump();
  const std::string first = world.broadcast_string(mine, 0);
  std::string differences;
  if (mine != first) {
    auto reference = nlohmann::json::parse(first).get<std::map<std::string, std::string>>();
    for (const auto& [key, value] : c.resolved) {
      auto it = reference.find(key);
      const std::string other = it == reference.end() ? "(absent)" : it->second;
      if (other != value)
        differences += " " + key + " = '" + value + "' (rank 0: '" + other + "');";
    }
  }
  const bool any = world.all_reduce_max(differences.empty() ? 0 : 1) > 0;
  if (!differences.empty())
    fail("rank ", world.rank(), " runs a different configuration from rank 0:", differences);
  if (any)
    fail("rank ", world.rank(), ": another rank runs a different configuration (see its message)");
}

// A testing aid: FRUGAL_INJECT_FAULT=exit:RANK:STEP or hang:RANK:STEP makes that rank die or
// stop answering at that step, to show that the others report it instead of hanging.
void maybe_inject_fault(int rank, int64_t step) {
  const char* spec = std::getenv("FRUGAL_INJECT_FAULT");
  if (!spec) return;
  char kind[8] = {0};
  int fault_rank = -1;
  long long fault_step = -1;
  if (std::sscanf(spec, "%7[a-z]:%d:%lld", kind, &fault_rank, &fault_step) != 3) return;
  if (fault_rank != rank || fault_step != step) return;
  std::fprintf(stderr, "frugal: rank %d: injected fault '%s' at step %lld\n", rank, kind,
               fault_step);
  if (std::string(kind) == "exit") std::_Exit(3);
  if (std::string(kind) == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// The model's batch of this rank: whole sequences, or with context parallelism this rank's
// zigzag share of each.
Batch to_model_batch(const TokenBatch& tokens, const Mesh& mesh) {
  Batch b;
  b.batch = tokens.inputs.size(0);
  b.seq = tokens.inputs.size(1);
  b.tokens = tokens.inputs.view({b.batch * b.seq});
  b.targets = tokens.targets.view({b.batch * b.seq});
  b.positions = sequence_positions(b.batch, b.seq);
  if (mesh.cp_size == 1) return b;
  return context_parallel_slice(b, zigzag_layout(b.seq, mesh.cp_size, mesh.cp_rank));
}

// Mean validation loss over (at most eval_batches per rank of) the validation split.
double evaluate(LlamaModel& model, ParameterProvider& params, const TokenFile& val,
                const TrainConfig& c, const Mesh& mesh) {
  Comm& world = *mesh.world;
  EvalIterator it(val.view(), c.train.seq_len, c.train.micro_batch_size, mesh.dp_rank, mesh.dp_size,
                  c.train.eval_batches);
  TokenBatch tokens;
  double loss_sum = 0;
  int64_t counted = 0;
  while (it.next(tokens)) {
    Batch b = to_model_batch(tokens, mesh);
    loss_sum += model.forward_loss(b, params);
    counted += counted_targets(b.targets);
  }
  const double total = world.all_reduce_sum(double(counted));
  if (total == 0)
    fail("the validation split of '", c.data.dir,
         "' holds no window of train.seq_len = ", c.train.seq_len, " + 1 tokens");
  return world.all_reduce_sum(loss_sum) / total;
}

void save_checkpoint(const CheckpointDir& dir, int64_t step, Zero3Parameters& params, AdamW& opt,
                     const BatchSampler& sampler, const TrainConfig& c, Comm& world) {
  params.wait_for_updates();  // a host optimizer may still be updating (offload)
  std::vector<NamedTensor> tensors;
  for (size_t i = 0; i < opt.shards().size(); ++i) {
    const TrainableShard& s = opt.shards()[i];
    // Host copies of what lives on a GPU (the host tensors themselves on the CPU).
    tensors.push_back({"model/" + s.name, ops::to_host_f32(s.param)});
    tensors.push_back({"optim/exp_avg/" + s.name, ops::to_host_f32(opt.first_moment(i))});
    tensors.push_back({"optim/exp_avg_sq/" + s.name, ops::to_host_f32(opt.second_moment(i))});
  }
  nlohmann::json manifest = {
      {"format", "frugal-checkpoint-2"},
      {"step", step},
      {"world_size", world.size()},
      {"rank", world.rank()},
      {"layout", "rows of each tensor split over the ranks in blocks of ceil(rows / world_size)"},
      {"model", llama_config_to_json(c.model)},
      {"sampler", {{"epoch", sampler.state().epoch}, {"position", sampler.state().position}}},
      {"config", c.resolved}};
  std::string error;
  try {
    dir.save_rank(step, world.rank(), tensors, manifest);
  } catch (const Error& e) {
    error = e.what();
  }
  // Commit only when every rank has its file on disk; otherwise the previous step stays.
  const bool all_saved = world.all_reduce_max(error.empty() ? 0 : 1) == 0;
  if (!error.empty()) fail("checkpoint of step ", step, " failed: ", error);
  if (!all_saved) fail("checkpoint of step ", step, " failed on another rank (see its message)");
  if (world.rank() == 0) dir.commit(step, c.ckpt.keep);
  world.barrier();
}

// Reads this rank's rows of every tensor, whatever the number of ranks that saved them.
int64_t load_checkpoint(const CheckpointDir& dir, int64_t step, Zero3Parameters& params, AdamW& opt,
                        BatchSampler& sampler, const TrainConfig& c, Comm& world) {
  const nlohmann::json manifest = dir.manifest(step);
  if (manifest.at("model") != llama_config_to_json(c.model))
    fail("checkpoint step ", step, " in '", dir.step_dir(step), "' has model ",
         manifest.at("model").dump(), " but the config asks for ",
         llama_config_to_json(c.model).dump());
  ShardedTensorReader reader(dir, step, manifest.at("world_size").get<int>());
  size_t index = 0;  // the optimizer's shards: the trainable parameters, in unit order
  for (size_t u = 0; u < params.units().size(); ++u)
    for (size_t i = 0; i < params.units()[u].params.size(); ++i) {
      // A frozen parameter (LoRA's base) is not saved: it comes from model.hf_path or the
      // seed again, like at the start.
      if (!params.units()[u].params[i].trainable) continue;
      const size_t k = index++;
      const ShardLayout& l = params.layout(u, i);
      const int64_t first = l.first_row(world.rank()), last = l.last_row(world.rank());
      if (last == first) continue;
      auto load = [&](const std::string& prefix, Tensor& shard) {
        Tensor rows = shard.rows(0, last - first);
        // Checkpoints hold fp32 (a bf16 run's values widen exactly and narrow back unchanged).
        ops::assign(rows, reader.read_rows(prefix + l.name, l.shape, first, last).view(rows.shape()));
      };
      load("model/", params.shard(u, i));
      load("optim/exp_avg/", opt.first_moment(k));
      load("optim/exp_avg_sq/", opt.second_moment(k));
    }
  SamplerState state;
  state.epoch = manifest.at("sampler").at("epoch").get<uint64_t>();
  state.position = manifest.at("sampler").at("position").get<uint64_t>();
  sampler.restore(state);
  params.refresh_copies();
  return manifest.at("step").get<int64_t>();
}

// Loads the newest committed checkpoint that every rank can read, falling back to older
// committed steps (ckpt.keep) when one is corrupt; returns the step (0: none found).
int64_t resume(const CheckpointDir& dir, Zero3Parameters& params, AdamW& opt, BatchSampler& sampler,
               const TrainConfig& c, Comm& world) {
  const std::vector<int64_t> steps = dir.committed_steps();
  if (steps.empty()) {
    log_info("train.resume: no committed checkpoint under ", c.train.out_dir,
             "/ckpt, starting from scratch");
    return 0;
  }
  std::string errors;
  for (int64_t step : steps) {
    std::string error;
    int64_t loaded = 0;
    try {
      loaded = load_checkpoint(dir, step, params, opt, sampler, c, world);
    } catch (const Error& e) {
      error = e.what();
    } catch (const nlohmann::json::exception& e) {
      error = "checkpoint '" + dir.step_dir(step) + "' has a malformed manifest: " + e.what();
    }
    // Every rank must resume from the same step: one rank's bad file rules the step out.
    if (world.all_reduce_max(error.empty() ? 0 : 1) == 0) {
      if (!errors.empty()) log_warn("resuming from an older checkpoint because:", errors);
      log_info("resumed from step ", loaded, " (", dir.step_dir(step), ")");
      return loaded;
    }
    const std::string why = error.empty() ? "another rank could not read its file" : error;
    log_warn("checkpoint step ", step, " is unusable: ", why);
    errors += " step " + std::to_string(step) + ": " + why + ";";
  }
  fail("no committed checkpoint under '", c.train.out_dir, "/ckpt' can be read:", errors,
       " (the files are kept; start a new out_dir, or fix them)");
}

// A resumed run rewrites metrics.jsonl without the records after its step (a crash after
// the checkpoint left some), so every step appears once.
void truncate_metrics(const fs::path& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_discarded() && record.value("step", int64_t(0)) <= step) kept += line + "\n";
  }
  in.close();
  const fs::path tmp = path.string() + ".tmp";
  std::ofstream(tmp) << kept;
  fs::rename(tmp, path);
}

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

TrainSummary run_training(const TrainConfig& config) {
  TrainConfig c = config;
  // Starting from a Hugging Face model: its shape wins over [model], its weights over init.
  std::optional<HfModelDir> hf;
  if (!c.model_hf_path.empty()) {
    hf.emplace(c.model_hf_path);
    c.model = hf->config();
    const nlohmann::json shape = llama_config_to_json(c.model);
    for (auto it = shape.begin(); it != shape.end(); ++it)
      c.resolved["model." + it.key()] = it.value().dump();
    c.validate_model_dependent();
  }
  Mesh host_mesh = make_mesh(static_cast<int>(c.parallel.cp), c.parallel.timeout_s);
  const int rank = host_mesh.world->rank();
  check_same_config(*host_mesh.world, c);
  // One GPU per rank: `auto` takes the GPUs only when every node has one for each of its
  // ranks, and every rank decides the same (a rank on the CPU and one on a GPU cannot train
  // together).
  const int gpus = device_count(), node_ranks = mpi_node_size();
  const bool enough_gpus = gpus > 0 && gpus >= node_ranks;
  const bool everywhere = host_mesh.world->all_reduce_max(enough_gpus ? 0 : 1) == 0;
  if (c.parallel.device == DeviceChoice::cuda && !everywhere)
    fail("config key 'parallel.device': cuda needs one GPU per rank, but ",
         enough_gpus ? "another node has fewer GPUs than ranks"
                     : "this node has " + std::to_string(node_ranks) + " rank(s) and sees " +
                           std::to_string(gpus) + " GPU(s)",
         kHaveCuda ? "" : " (this frugal was built without CUDA)");
  const bool use_gpu = c.parallel.device == DeviceChoice::cuda ||
                       (c.parallel.device == DeviceChoice::automatic && everywhere);
  if (c.parallel.device == DeviceChoice::automatic && gpus > 0 && !use_gpu)
    log_warn("parallel.device = auto: ", node_ranks, " rank(s) on this node but ", gpus,
             " GPU(s), so the run trains on the CPU; start one rank per GPU to use them");
  const bool bf16_state = c.optim.state_dtype == StateDType::bf16;
  if (bf16_state && !use_gpu)
    fail("config key 'optim.state_dtype': bf16 needs GPUs, and this run trains on the CPU (",
         gpus, " GPU(s) for ", node_ranks, " rank(s) on this node)");

  // --- data --------------------------------------------------------------------------------
  const fs::path data_dir(c.data.dir);
  for (const char* f : {"train.tok", "val.tok", "tokenizer.model"})
    if (!fs::exists(data_dir / f))
      fail("config key 'data.dir': '", c.data.dir, "' has no ", f,
           " (make it with `frugal prepare TEXT... --out ", c.data.dir, "`)");
  TokenFile train_tokens((data_dir / "train.tok").string());
  TokenFile val_tokens((data_dir / "val.tok").string());
  Tokenizer tokenizer((data_dir / "tokenizer.model").string());
  if (int64_t(train_tokens.header().vocab_size) > c.model.vocab_size)
    fail("config key 'model.vocab_size': ", c.model.vocab_size,
         " is smaller than the vocabulary of '", c.data.dir, "' (",
         train_tokens.header().vocab_size, ")");
  SamplerConfig sampler_config;
  sampler_config.seq_len = c.train.seq_len;
  sampler_config.micro_batch_size = c.train.micro_batch_size;
  sampler_config.seed = c.train.seed;
  // Ranks of one cp group read the same sequences; the dp groups read different ones.
  sampler_config.rank = host_mesh.dp_rank;
  sampler_config.world = host_mesh.dp_size;
  BatchSampler sampler(train_tokens.view(), sampler_config);

  // --- model, shards, optimizer ----------------------------------------------------------------
  if (rank == 0) fs::create_directories(c.train.out_dir);
  // The GPU (one per rank, picked by the node-local rank) and its communicator: NCCL for the
  // weights and gradients, MPI underneath for host values.
  RunMemory memory(c.parallel, use_gpu, host_mesh.local_rank);
  Mesh gpu_mesh;
#ifdef FRUGAL_HAVE_CUDA
  if (use_gpu) gpu_mesh = make_nccl_mesh(host_mesh, *memory.gpu, c.parallel.timeout_s);
#endif
  Mesh& mesh = use_gpu ? gpu_mesh : host_mesh;
  Comm& world = *mesh.world;
  LlamaModel model(c.model);
  const AttentionOperator ring = ring_attention_operator(*mesh.cp);
  if (mesh.cp_size > 1) model.set_attention(&ring);
  LoraConfig lora;
  if (c.train.type != TrainType::full) {
    lora.rank = c.lora.rank;
    lora.alpha = c.lora.alpha;
    lora.targets = lora_targets_from_names(c.lora.targets);
    lora.dropout = c.lora.dropout;
    lora.seed = c.train.seed;
    model.set_lora(&lora);
  }
  Zero3Init init;
  if (hf) {
    // Each rank reads only its own rows of each tensor (one tensor's rows at a time): host
    // memory stays near this rank's share, never the whole model. Adapters start from the seed.
    init.load_rows = [&hf](const std::string& name, int64_t first, int64_t last, Tensor& rows) {
      if (is_lora_a(name) || is_lora_b(name)) return false;
      hf->read_rows_into(name, first, last, rows);
      return true;
    };
  }
  // QLoRA: the frozen projections of every block in 4 bits (as fsdp_qlora quantizes them).
  const auto projection = [](const ParamSpec& p) {
    return p.shape.size() == 2 && is_block_projection(p.name);
  };
  if (c.train.type == TrainType::qlora) init.nf4 = projection;
  if (c.train.type == TrainType::hqq_lora) init.hqq = projection;
  Zero3Parameters params(lora.enabled() ? lora_units(c.model, lora) : llama_units(c.model), world,
                         {memory.params.get(), memory.grads.get(), memory.gathered.get(),
                          memory.copies.get(), bf16_state ? DType::bf16 : DType::f32},
                         c.train.seed, static_cast<float>(c.train.init_std), true, init);
  AdamWConfig adamw_config{c.optim.beta1, c.optim.beta2, c.optim.eps, c.optim.weight_decay,
                           c.optim.grad_clip};
  AdamW optimizer(params.trainable(), adamw_config, *memory.optimizer);
  LrSchedule schedule{c.train.lr, c.train.warmup_steps, c.train.steps, c.train.min_lr_ratio};
  CheckpointDir ckpt_dir((fs::path(c.train.out_dir) / "ckpt").string());

  if (hf) {
    log_info("weights: ", c.model_hf_path, " (", c.model.parameter_count(), " parameters)");
    const std::string hf_tokenizer = hf->tokenizer_path();
    if (!hf_tokenizer.empty() &&
        fs::file_size(hf_tokenizer) != fs::file_size(data_dir / "tokenizer.model"))
      log_warn("the tokenizer of ", c.data.dir, " differs from ", hf_tokenizer,
               "; prepare the data with `frugal prepare --tokenizer ", hf_tokenizer, "`");
  }

  int64_t start_step = 0;
  if (c.train.resume) {
    world.barrier();  // rank 0 may have just created out_dir
    start_step = resume(ckpt_dir, params, optimizer, sampler, c, world);
  }
  std::optional<MetricsWriter> metrics;
  if (rank == 0) {
    const fs::path metrics_path = fs::path(c.train.out_dir) / "metrics.jsonl";
    if (start_step > 0) truncate_metrics(metrics_path, start_step);
    metrics.emplace(metrics_path.string(), start_step > 0);
    // The run directory is self-contained: eval, generate and export need only it.
    fs::copy_file(data_dir / "tokenizer.model", fs::path(c.train.out_dir) / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    std::ofstream config_out(fs::path(c.train.out_dir) / "train_config.json");
    config_out << nlohmann::json(c.resolved).dump(2) << "\n";
  }

  const int64_t tokens_per_step =
      c.train.micro_batch_size * c.train.seq_len * c.train.grad_accum_steps * mesh.dp_size;
  log_info("frugal train: model ", c.model.parameter_count(), " parameters (",
           c.model.num_hidden_layers, " layers, hidden ", c.model.hidden_size, ", heads ",
           c.model.num_attention_heads, "/", c.model.num_key_value_heads, ", vocab ",
           c.model.vocab_size, "); ", world.size(), " rank(s) = dp ", mesh.dp_size, " x cp ",
           mesh.cp_size, ", ZeRO-3, offload ", c.parallel.offload, ", ",
           !use_gpu     ? "CPU (fp32)"
           : bf16_state ? "GPU (bf16 compute, bf16 master weights, gradients and moments)"
                        : "GPU (bf16 compute, fp32 master weights)");
  if (lora.enabled()) {
    int64_t adapters = 0;
    for (const UnitSpec& u : params.units())
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
      memory.copies ? ", weight copies " + mib(memory.copies->stats().in_use_bytes) : "";
  log_info("memory per rank: parameters ", mib(memory.params->stats().in_use_bytes),
           ", gradients ", mib(memory.grads->stats().in_use_bytes), ", optimizer ",
           mib(memory.optimizer->stats().in_use_bytes), copies, ", gathered units up to ",
           mib(2 * params.largest_unit_bytes(dtype_bytes(ops::compute_dtype(memory.gathered->device())))),
           " (two units' weights and gradients)");
  log_info("data: ", train_tokens.size(), " training tokens, ", val_tokens.size(),
           " validation tokens; ", tokens_per_step, " tokens per step; steps ", start_step + 1,
           "..", c.train.steps, "; activation checkpointing ",
           checkpoint_policy_name(c.train.activation_checkpointing));

  TrainSummary summary;
  summary.first_val_loss = evaluate(model, params, val_tokens, c, mesh);
  log_info("step ", start_step, " | val_loss ", fixed(summary.first_val_loss, 4));
  if (metrics && start_step == 0)
    metrics->write({{"step", 0}, {"val_loss", summary.first_val_loss}});
  summary.final_val_loss = summary.first_val_loss;

  // --- the loop --------------------------------------------------------------------------------
  const double loop_start = now_seconds();
  double window_start = loop_start;
  int64_t window_tokens = 0;
  for (int64_t step = start_step + 1; step <= c.train.steps; ++step) {
    maybe_inject_fault(rank, step);
    const double step_start = now_seconds();
    const double lr = schedule.at(step);
    std::vector<Batch> micro;
    for (int64_t m = 0; m < c.train.grad_accum_steps; ++m)
      micro.push_back(to_model_batch(sampler.next(), mesh));
    StepResult result = train_step(model, params, optimizer, micro, &world, lr, step,
                                   c.train.activation_checkpointing);
    if (!std::isfinite(result.loss))
      fail("training loss became ", result.loss, " at step ", step,
           "; try a lower train.lr or a stronger optim.grad_clip");

    const double step_seconds = now_seconds() - step_start;
    window_tokens += tokens_per_step;
    nlohmann::json record = {{"step", step},
                             {"loss", result.loss},
                             {"lr", lr},
                             {"grad_norm", result.grad_norm},
                             {"tokens_per_s", double(tokens_per_step) / step_seconds},
                             {"seconds",
                              {{"forward_backward", result.forward_backward_seconds},
                               {"optimizer", result.optimizer_seconds}}},
                             {"peak_memory_bytes", memory.peak_bytes()},
                             {"memory", memory.report()}};
    if (record["memory"].contains("device_peak_bytes"))  // a GPU run
      record["device_peak_bytes"] = record["memory"]["device_peak_bytes"];
    // Host memory as the operating system saw it: every rank's peak resident set, summed (the
    // bound a node holding all the ranks must have; what offload and loading cost in RAM).
    record["host_peak_rss_bytes"] = world.all_reduce_sum(double(peak_resident_bytes()));
    const bool last = step == c.train.steps;
    if (last || (c.train.eval_every > 0 && step % c.train.eval_every == 0)) {
      summary.final_val_loss = evaluate(model, params, val_tokens, c, mesh);
      record["val_loss"] = summary.final_val_loss;
    }
    if (metrics) metrics->write(record);

    if (step % c.monitor.log_every == 0 || last || record.contains("val_loss")) {
      const double now = now_seconds();
      const double rate = window_tokens / std::max(1e-9, now - window_start);
      const double eta = (c.train.steps - step) * (now - loop_start) / double(step - start_step);
      char lr_text[16];
      std::snprintf(lr_text, sizeof lr_text, "%.2e", lr);
      std::string line = "step " + std::to_string(step) + "/" + std::to_string(c.train.steps) +
                         " | loss " + fixed(result.loss, 4) + " | lr " + lr_text + " | grad " +
                         fixed(result.grad_norm, 3) + " | " + fixed(rate, 0) + " tok/s | ETA " +
                         format_duration(eta);
      if (record.contains("val_loss")) line += " | val_loss " + fixed(summary.final_val_loss, 4);
      log_info(line);
      window_start = now;
      window_tokens = 0;
    }
    if ((last && c.ckpt.final) || (c.ckpt.every > 0 && step % c.ckpt.every == 0)) {
      save_checkpoint(ckpt_dir, step, params, optimizer, sampler, c, world);
      log_info("checkpoint: ", ckpt_dir.step_dir(step));
    }
  }
  summary.steps_done = c.train.steps - start_step;
  const double elapsed = now_seconds() - loop_start;
  summary.tokens_per_s = summary.steps_done * double(tokens_per_step) / std::max(1e-9, elapsed);
  const nlohmann::json report = memory.report();
  log_info("done: ", summary.steps_done, " steps in ", format_duration(elapsed), ", ",
           fixed(summary.tokens_per_s, 0), " tok/s; val_loss ", fixed(summary.first_val_loss, 4),
           " -> ", fixed(summary.final_val_loss, 4));
  log_info("memory per rank: parameters ", mib(report["parameters_bytes"]), ", gradients ",
           mib(report["gradients_bytes"]), ", optimizer ", mib(report["optimizer_bytes"]),
           ", gathered peak ", mib(report["gathered_peak_bytes"]), ", activations peak ",
           mib(report["activations_peak_bytes"]));
#ifdef FRUGAL_HAVE_CUDA
  if (memory.gpu)
    log_info("GPU ", memory.gpu->device(), ": ", memory.gpu->device_memory().usage_report());
#endif

  if (c.train.sample_tokens > 0) {
    // Every rank generates (the weights are gathered collectively) the whole sequence with
    // ordinary attention; rank 0 prints.
    model.set_attention(nullptr);
    SamplingOptions sampling;
    sampling.max_new_tokens = c.train.sample_tokens;
    sampling.temperature = 0.8f;
    sampling.top_p = 0.95f;
    sampling.seed = c.train.seed;
    sampling.stop_token = tokenizer.eos_id();
    std::vector<int32_t> prompt = tokenizer.encode(c.train.sample_prompt);
    prompt.insert(prompt.begin(), tokenizer.bos_id());
    std::vector<int32_t> out = generate(model, params, prompt, sampling);
    log_info("sample: ", tokenizer.decode(out));
  }
  return summary;
}

}  // namespace frugal
