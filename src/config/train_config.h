// Everything a training run is configured by, one struct per .cfg section, with the modes as
// enums. Each field's key, allowed values and doc are in config/config_keys.cpp; the app layer
// fills the struct from .cfg files and --section.key=value overrides (app/options.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/enum_names.h"
#include "data/packing.h"
#include "data/train_on.h"
#include "model/checkpoint_policy.h"
#include "model/fp8_scaling.h"
#include "model/llama_config.h"
#include "model/loss_chunk.h"
#include "optim/galore_modes.h"

namespace frugal {

// train.type: every weight trains, or the base is frozen and LoRA adapters train (qlora and
// hqq_lora with the base's block projections in 4 bits).
enum class TrainType { full, lora, qlora, hqq_lora };
inline std::span<const EnumName<TrainType>> enum_names(TrainType) {
  static constexpr EnumName<TrainType> names[] = {{TrainType::full, "full"},
                                                  {TrainType::lora, "lora"},
                                                  {TrainType::qlora, "qlora"},
                                                  {TrainType::hqq_lora, "hqq_lora"}};
  return names;
}

// parallel.offload: what lives in host memory instead of the compute device.
enum class Offload { none, optimizer, params };
inline std::span<const EnumName<Offload>> enum_names(Offload) {
  static constexpr EnumName<Offload> names[] = {
      {Offload::none, "none"}, {Offload::optimizer, "optimizer"}, {Offload::params, "params"}};
  return names;
}

// optim.state_dtype: the dtype of master weights, gradient shards and AdamW moments; int8:
// fp32 master weights and gradient shards, the matrices' moments 8-bit (bitsandbytes'
// block-wise AdamW8bit, optim/quantized_moments.h).
enum class StateDType { fp32, bf16, int8 };
inline std::span<const EnumName<StateDType>> enum_names(StateDType) {
  static constexpr EnumName<StateDType> names[] = {
      {StateDType::fp32, "fp32"}, {StateDType::bf16, "bf16"}, {StateDType::int8, "int8"}};
  return names;
}

// optim.master_dtype: the dtype of master weights and gradient shards (auto: bf16 when
// optim.state_dtype = bf16, else fp32).
enum class MasterDType { automatic, fp32, bf16 };
inline std::span<const EnumName<MasterDType>> enum_names(MasterDType) {
  static constexpr EnumName<MasterDType> names[] = {
      {MasterDType::automatic, "auto"}, {MasterDType::fp32, "fp32"}, {MasterDType::bf16, "bf16"}};
  return names;
}

// Whether the master weights (and gradient shards) are bf16: master_dtype = bf16, or auto with
// bf16 state.
inline bool bf16_master(MasterDType master, StateDType state) {
  return master == MasterDType::bf16 ||
         (master == MasterDType::automatic && state == StateDType::bf16);
}

// optim.bf16_rounding: how an update is rounded into a bf16 master weight
// (kernels/stochastic_rounding.h).
enum class Bf16Rounding { stochastic, nearest };
inline std::span<const EnumName<Bf16Rounding>> enum_names(Bf16Rounding) {
  static constexpr EnumName<Bf16Rounding> names[] = {{Bf16Rounding::stochastic, "stochastic"},
                                                     {Bf16Rounding::nearest, "nearest"}};
  return names;
}

// optim.type: AdamW on every weight, or GaLore's AdamW ([galore]) on the blocks' matrices.
enum class OptimizerType { adamw, galore_adamw };
inline std::span<const EnumName<OptimizerType>> enum_names(OptimizerType) {
  static constexpr EnumName<OptimizerType> names[] = {
      {OptimizerType::adamw, "adamw"}, {OptimizerType::galore_adamw, "galore_adamw"}};
  return names;
}

// optim.update: when the optimizer's updates run. step: after the whole backward, from the
// global gradient norm. per_layer: each unit's as soon as its gradients are final in the
// backward of the step's last micro-batch (train/per_layer_updates.h).
enum class UpdateTiming { step, per_layer };
inline std::span<const EnumName<UpdateTiming>> enum_names(UpdateTiming) {
  static constexpr EnumName<UpdateTiming> names[] = {{UpdateTiming::step, "step"},
                                                     {UpdateTiming::per_layer, "per_layer"}};
  return names;
}

// optim.per_layer_clip: what optim.grad_clip does under per-layer updates, where the global
// norm is known only after the last unit has been updated (train/per_layer_updates.h).
enum class PerLayerClip { none, unit, previous_norm };
inline std::span<const EnumName<PerLayerClip>> enum_names(PerLayerClip) {
  static constexpr EnumName<PerLayerClip> names[] = {
      {PerLayerClip::none, "none"},
      {PerLayerClip::unit, "unit"},
      {PerLayerClip::previous_norm, "previous_norm"}};
  return names;
}

// parallel.device: where the model runs (automatic: the GPUs when every rank has one).
enum class DeviceChoice { automatic, cpu, cuda };
inline std::span<const EnumName<DeviceChoice>> enum_names(DeviceChoice) {
  static constexpr EnumName<DeviceChoice> names[] = {
      {DeviceChoice::automatic, "auto"}, {DeviceChoice::cpu, "cpu"}, {DeviceChoice::cuda, "cuda"}};
  return names;
}

// monitor.on_divergence: what a loss spike (or a run of non-finite steps) does.
enum class DivergenceAction { warn, skip_batch, rollback };
inline std::span<const EnumName<DivergenceAction>> enum_names(DivergenceAction) {
  static constexpr EnumName<DivergenceAction> names[] = {
      {DivergenceAction::warn, "warn"},
      {DivergenceAction::skip_batch, "skip_batch"},
      {DivergenceAction::rollback, "rollback"}};
  return names;
}

// train.activation_offload: what of the activations waits for the backward in host memory.
enum class ActivationOffload { none, inputs };
inline std::span<const EnumName<ActivationOffload>> enum_names(ActivationOffload) {
  static constexpr EnumName<ActivationOffload> names[] = {{ActivationOffload::none, "none"},
                                                          {ActivationOffload::inputs, "inputs"}};
  return names;
}

struct DataConfig {
  std::string dir = "data/fortunes";
  TrainOn train_on = TrainOn::automatic;
  Packing packing = Packing::automatic;
  LongDocuments long_documents = LongDocuments::split;
};

struct TrainSettings {
  TrainType type = TrainType::full;
  int64_t steps = 300;
  uint64_t seed = 1234;
  std::string out_dir = "out/tiny";
  double lr = 3e-3;
  int64_t warmup_steps = 30;
  double min_lr_ratio = 0.1;
  int64_t micro_batch_size = 8;
  int64_t grad_accum_steps = 1;
  int64_t seq_len = 128;
  int64_t eval_every = 50;
  int64_t eval_batches = 16;
  double init_std = 0.02;
  CheckpointPolicy activation_checkpointing = CheckpointPolicy::none;
  ActivationOffload activation_offload = ActivationOffload::none;
  int64_t mlp_chunk_tokens = 0;  // 0: chosen from the tokens (model/llama_mlp.h)
  int64_t loss_chunk_tokens = kDefaultLossChunkTokens;  // model/loss_chunk.h
  bool resume = false;
  int64_t sample_tokens = 48;
  std::string sample_prompt = "The ";
};

struct LoraSettings {
  int64_t rank = 16;
  double alpha = 32;
  double dropout = 0;
  std::string targets = "all";
};

struct OptimConfig {
  OptimizerType type = OptimizerType::adamw;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  StateDType state_dtype = StateDType::fp32;
  MasterDType master_dtype = MasterDType::automatic;
  Bf16Rounding bf16_rounding = Bf16Rounding::stochastic;
  bool bf16_master() const;  // frugal::bf16_master of the two keys
  UpdateTiming update = UpdateTiming::step;
  PerLayerClip per_layer_clip = PerLayerClip::unit;
};

struct GaloreSettings {
  int64_t rank = 128;
  int64_t update_proj_gap = 200;
  double scale = 0.25;
  GaloreProjectorKind projector = GaloreProjectorKind::randomized;
  int64_t oversampling = 8;
  int64_t power_iterations = 1;
  MomentsOnRefresh moments_on_refresh = MomentsOnRefresh::keep;
  bool stagger = true;
  GaloreRefresh refresh = GaloreRefresh::pipelined;
  GaloreProjectionPrecision precision = GaloreProjectionPrecision::bf16;
  bool profile = false;
};

struct ParallelConfig {
  Offload offload = Offload::none;
  double timeout_s = 300;
  int64_t cp = 1;
  int64_t dp_shard = 0;                   // data-parallel ranks per replica (HSDP); 0: one node's
  int64_t node_ranks = 0;                 // ranks per node, consecutive; 0: those that share memory
  bool replica_galore_projection = true;  // GaLore's projected gradients cross the replicas
  DeviceChoice device = DeviceChoice::automatic;
  std::string gpu_mem_limit = "0";

  size_t gpu_mem_limit_bytes() const;  // parsed, throws Error naming the key
};

struct CkptConfig {
  int64_t every = 0;
  int64_t keep = 2;
  bool final = true;
  bool async = true;  // copy, then write on a thread (ckpt.async)
  // Whether saves stage a host copy to write in the background: asked for, and some save is
  // scheduled. A run that saves only when a signal stops it writes that save synchronously
  // (the run ends after it anyway) and pins no staging memory up front.
  bool stages_saves() const { return async && (every > 0 || final); }
};

// [fp8]: the block linears through FP8 GEMMs (model/fp8_scaling.h).
struct Fp8Config {
  bool enabled = false;
  Fp8Recipe recipe = Fp8Recipe::delayed;
  int64_t amax_history_len = 16;
  int64_t margin = 0;
  std::string linears = "all";
  bool gather_weights = true;
};

struct MonitorConfig {
  int64_t log_every = 10;
  bool health = true;  // the health member of metrics.jsonl every log_every steps
  DivergenceAction on_divergence = DivergenceAction::warn;
  int64_t spike_window = 50;
  double spike_z = 6;
  int64_t max_skipped_steps = 5;
  int64_t max_rollbacks = 3;
  double rollback_lr_factor = 0.5;
  int64_t rollback_lr_steps = 100;
  double slow_rank_factor = 1.5;
  int64_t check_recompute_every = 100;
  int64_t check_replicas_every = 100;
  std::string tensorboard;  // TensorBoard event files go here (empty: none)
};

struct TrainConfig {
  LlamaConfig model;
  std::string model_hf_path;  // model.hf_path
  DataConfig data;
  TrainSettings train;
  LoraSettings lora;
  OptimConfig optim;
  GaloreSettings galore;
  ParallelConfig parallel;
  CkptConfig ckpt;
  Fp8Config fp8;
  MonitorConfig monitor;
  // Every key with the value in force ("train.lr" -> "0.003"), for logs and checkpoints: ranks
  // compare it, and eval / export read a run's modes back from a checkpoint's copy, so the
  // spellings must stay as they are.
  std::map<std::string, std::string> resolved;

  void resolve();         // fills `resolved` from the fields
  void validate() const;  // throws Error naming the key
  // Why the run ignores key `name` ("optim.type is adamw" for a [galore] key), or "" when it
  // reads it: a full run has no adapters ([lora]), AdamW no subspace ([galore]), and a run
  // without FP8 reads only fp8.enabled of [fp8].
  std::string unused_because(const std::string& name) const;
  void validate_model_dependent() const;  // the checks that need the model's shape
  void validate_per_layer_updates() const;  // optim.update = per_layer's refusals
};

}  // namespace frugal
