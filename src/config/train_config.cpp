// Validation of a training configuration: each key's own rule comes from the key table
// (config/config_keys.cpp); the rules between keys are here.
#include "config/train_config.h"

#include <algorithm>

#include "config/config_keys.h"
#include "core/log.h"

namespace frugal {

void TrainConfig::resolve() {
  for (const ConfigKey& key : config_keys(*this)) resolved[key.name] = key.text();
}

void TrainConfig::validate_model_dependent() const {
  model.validate();
  if (train.seq_len > model.context_length())
    fail("config key 'train.seq_len': ", train.seq_len, " exceeds the model's context of ",
         model.context_length(),
         " tokens (model.max_position_embeddings = ", model.max_position_embeddings,
         ", rope scaling ", enum_name(model.rope_scaling.type), ")");
}

std::string TrainConfig::unused_because(const std::string& name) const {
  const std::string section = name.substr(0, name.find('.'));
  if (section == "lora" && train.type == TrainType::full) return "train.type is full";
  if (section == "galore" && optim.type != OptimizerType::galore_adamw)
    return detail::concat("optim.type is ", enum_name(optim.type));
  if (section == "fp8" && name != "fp8.enabled" && !fp8.enabled) return "fp8.enabled is false";
  if (name == "optim.bf16_rounding" && !optim.bf16_master()) return "the master weights are fp32";
  if (name == "optim.per_layer_clip" && optim.update == UpdateTiming::step)
    return "optim.update is step";
  return "";
}

void TrainConfig::validate() const {
  // Each key's own rule first (a NaN is "not a finite number", not "must be > 0"), then the
  // rules between keys.
  TrainConfig copy = *this;  // config_keys points into a config it may write; check() only reads
  for (const ConfigKey& key : config_keys(copy))
    if (unused_because(key.name).empty()) key.check();  // a key the run ignores may hold anything
  // With model.hf_path the shape comes from config.json: checked once it is read.
  if (model_hf_path.empty()) validate_model_dependent();
  if (optim.type == OptimizerType::galore_adamw && train.type != TrainType::full)
    fail(
        "config key 'optim.type': galore_adamw trains full weights (train.type = full), and "
        "train.type is ",
        train.type, ": LoRA's adapters are low-rank already, use adamw");
  if (optim.type == OptimizerType::galore_adamw && galore.refresh == GaloreRefresh::pipelined &&
      galore.moments_on_refresh == MomentsOnRefresh::reset)
    fail(
        "config key 'galore.moments_on_refresh': reset needs galore.refresh = inline (a "
        "pipelined refresh installs its projector steps after it began, and reset's bias "
        "correction counts from the refresh step)");
  if (optim.state_dtype == StateDType::bf16 && parallel.offload != Offload::none)
    fail("config key 'optim.state_dtype': bf16 works without offload (parallel.offload = ",
         parallel.offload, "): offload keeps the fp32 state on the host instead");
  // bf16 moments come with bf16 masters: the fp32-master kernels take fp32 moments only.
  if (optim.master_dtype == MasterDType::fp32 && optim.state_dtype == StateDType::bf16)
    fail(
        "config key 'optim.master_dtype': fp32 with optim.state_dtype = bf16 is not supported "
        "(bf16 moments need bf16 master weights: master_dtype = auto or bf16, or state_dtype = "
        "fp32)");
  if (optim.bf16_master() && parallel.offload != Offload::none)
    fail("config key 'optim.master_dtype': bf16 works without offload (parallel.offload = ",
         parallel.offload, "): offload keeps fp32 master weights on the host instead");
  validate_per_layer_updates();
  if (monitor.on_divergence == DivergenceAction::rollback && ckpt.every == 0)
    fail(
        "config key 'monitor.on_divergence': rollback reloads the last checkpoint, and "
        "ckpt.every = 0 saves none before the end (set ckpt.every)");
}

bool OptimConfig::bf16_master() const { return frugal::bf16_master(master_dtype, state_dtype); }

// What per-layer updates (train/per_layer_updates.h) cannot follow, by name.
void TrainConfig::validate_per_layer_updates() const {
  if (optim.update != UpdateTiming::per_layer) return;
  if (parallel.offload != Offload::none)
    fail("config key 'optim.update': per_layer works without offload (parallel.offload = ",
         parallel.offload,
         "): offload keeps the gradient shards and the optimizer on the host, whose updates "
         "already run unit by unit beside the next forward, and per-layer updates would save no "
         "device memory there");
  if (monitor.on_divergence == DivergenceAction::skip_batch)
    fail(
        "config key 'monitor.on_divergence': skip_batch cannot undo per-layer updates "
        "(optim.update = per_layer updates the units during the backward, before the step's "
        "loss is known); use warn or rollback");
  if (optim.type == OptimizerType::galore_adamw && galore.refresh == GaloreRefresh::pipelined)
    fail(
        "config key 'galore.refresh': pipelined advances every matrix's refresh at the step's "
        "start, and optim.update = per_layer begins each unit's step in the backward; set "
        "galore.refresh = inline");
}

size_t ParallelConfig::gpu_mem_limit_bytes() const {
  return parse_bytes(gpu_mem_limit, "parallel.gpu_mem_limit");
}

}  // namespace frugal
