// Loading a model for eval and generate into ZeRO-3 shards over the ranks (sharded_model.h).
#include "train/sharded_model.h"

#include <functional>

#include "core/log.h"
#include "data/tokenizer.h"
#include "model/hf_model.h"
#include "model/lora.h"
#include "parallel/nccl_comm.h"
#include "parallel/zero3_parameters.h"
#include "train/run_memory.h"
#include "train/saved_model.h"

namespace frugal {

DeviceChoice device_choice_from_option(const std::string& command, const std::string& text) {
  if (std::optional<DeviceChoice> d = enum_from_name<DeviceChoice>(text)) return *d;
  fail(command, ": --device '", text, "' is not one of ", enum_name_list<DeviceChoice>());
}

ShardedModel::ShardedModel(const std::string& command, const ShardedModelOptions& options) {
  if (options.hf_dir.empty() == options.ckpt_path.empty())
    fail(command, ": give exactly one of --hf-model DIR or --ckpt DIR (see 'frugal ", command,
         " --help')");
  // Each rank reads its own rows of each tensor, one tensor at a time.
  std::function<void(const std::string&, int64_t, int64_t, Tensor&)> read_rows;
  std::unique_ptr<HfModelDir> hf;
  std::unique_ptr<SavedModelRows> saved;
  if (!options.hf_dir.empty()) {
    hf = std::make_unique<HfModelDir>(options.hf_dir);
    config_ = hf->config();
    source_ = "Hugging Face model '" + options.hf_dir + "'";
    tokenizer_path_ = hf->tokenizer_path();
    bos_id_ = hf->bos_token_id();
    eos_id_ = hf->eos_token_id();
    read_rows = [&hf](const std::string& name, int64_t first, int64_t last, Tensor& rows) {
      hf->read_rows_into(name, first, last, rows);
    };
  } else {
    saved = std::make_unique<SavedModelRows>(options.ckpt_path);
    config_ = saved->config();
    source_ = "checkpoint '" + saved->step_dir() + "'";
    tokenizer_path_ = saved->tokenizer_path();
    read_rows = [&saved](const std::string& name, int64_t first, int64_t last, Tensor& rows) {
      saved->read_rows_into(name, first, last, rows);
    };
  }
  // Ids the config does not give come from the tokenizer, else Llama's convention.
  if ((bos_id_ < 0 || eos_id_ < 0) && !tokenizer_path_.empty()) {
    Tokenizer tokenizer(tokenizer_path_);
    if (bos_id_ < 0) bos_id_ = tokenizer.bos_id();
    if (eos_id_ < 0) eos_id_ = tokenizer.eos_id();
  }
  if (bos_id_ < 0) bos_id_ = 1;
  if (eos_id_ < 0) eos_id_ = 2;

  parallel_.device = options.device;
  parallel_.gpu_mem_limit = options.gpu_mem_limit;
  parallel_.timeout_s = options.timeout_s;
  parallel_.gpu_mem_limit_bytes();  // a bad value is named before anything is allocated
  host_mesh_ = make_mesh(1, options.timeout_s);
  use_gpu_ = decide_gpu(options.device, *host_mesh_.world, command + ": --device");
  memory_ = std::make_unique<RunMemory>(parallel_, use_gpu_, host_mesh_.local_rank);
  Comm* shard_comm = host_mesh_.world.get();
#ifdef FRUGAL_HAVE_CUDA
  if (use_gpu_) {
    gpu_mesh_ = make_nccl_mesh(host_mesh_, *memory_->gpu, options.timeout_s);
    shard_comm = gpu_mesh_.world.get();
  }
#endif
  // Every weight frozen (no gradients, no optimizer state); with --quant the block
  // projections are stored 4-bit, as QLoRA's base is.
  std::vector<UnitSpec> units = llama_units(config_);
  for (UnitSpec& unit : units)
    for (ParamSpec& p : unit.params) p.trainable = false;
  Zero3Init init;
  init.load_rows = [&read_rows](const std::string& name, int64_t first, int64_t last,
                                Tensor& rows) {
    read_rows(name, first, last, rows);
    return true;
  };
  const auto projection = [](const ParamSpec& p) {
    return p.shape.size() == 2 && is_block_projection(p.name);
  };
  if (options.quant == QuantKind::nf4) init.nf4 = projection;
  if (options.quant == QuantKind::hqq) init.hqq = projection;
  params_ = std::make_unique<Zero3Parameters>(
      std::move(units), *shard_comm,
      Zero3Arenas{memory_->params.get(), memory_->grads.get(), memory_->gathered.get(),
                  memory_->copies.get(), DType::f32},
      0, 0.0f, /*with_grads=*/false, init);
}

ShardedModel::~ShardedModel() = default;

ParameterProvider& ShardedModel::params() { return *params_; }

std::string ShardedModel::describe() const {
  return std::to_string(host_mesh_.world->size()) + " rank(s), " +
         (use_gpu_ ? "one GPU each (bf16 compute)" : "CPU (fp32)") + ", ZeRO-3 shards of " +
         mib(params_->shard_bytes()) + " per rank";
}

}  // namespace frugal
