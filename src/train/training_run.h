// Everything one training run is made of, assembled from its configuration in dependency
// order: the ranks and their mesh, the device and its arenas, the data, the model (with LoRA
// or QLoRA), the sharded parameters, the optimizer, and the checkpoint manager over every
// stateful part. The step loop (trainer.cpp) uses it and assembles nothing itself.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ckpt/checkpoint_manager.h"
#include "config/train_config.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "model/hf_model.h"
#include "model/llama_block.h"
#include "model/llama_model.h"
#include "model/lora.h"
#include "optim/galore_adamw.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/mesh.h"
#include "parallel/zero3_parameters.h"
#include "train/per_layer_updates.h"
#include "train/run_dir_lock.h"
#include "train/run_memory.h"
#include "train/training_data.h"

namespace frugal {

struct TrainingRun {
  // Builds every part; an Error names what is wrong (a missing data file, a shape the
  // checkpoint or the tokenizer does not fit, a device that is not there).
  explicit TrainingRun(const TrainConfig& config);
  ~TrainingRun();
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  Mesh& mesh() { return use_gpu ? gpu_mesh : host_mesh; }
  Comm& world() { return *mesh().world; }
  int64_t tokens_per_step() const;
  // The lines that say what this run is: model, ranks, device, LoRA, memory per rank, data.
  void log_plan(int64_t start_step) const;
  // Refuses, with the figures, a run whose state cannot fit this node's host memory or the
  // GPU's cap (a lower bound: activations come on top).
  void check_memory_plan(const std::vector<UnitSpec>& units,
                         const std::function<bool(const ParamSpec&)>& projection,
                         const std::optional<GaloreConfig>& galore);
  // Where asynchronous checkpoints stage `state_bytes` of this rank's state, or null for
  // synchronous saves (ckpt.async = false, or not enough host memory on some rank's node).
  Arena* checkpoint_staging(size_t state_bytes);

  TrainConfig config;  // with a Hugging Face model's shape in [model]
  // Rank 0's lock on train.out_dir (null on the other ranks), taken before any rank writes
  // there; declared before every part that writes, so it is released after the last of them.
  std::unique_ptr<RunDirLock> out_dir_lock;
  std::optional<HfModelDir> hf;
  Mesh host_mesh;  // MPI over every rank, for host values
  bool use_gpu = false;
  std::unique_ptr<TokenFile> train_tokens, val_tokens;
  TrainingData data;  // what data.train_on selects in them, in data.packing's windows
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<BatchSampler> sampler;
  std::unique_ptr<RunMemory> memory;  // before every part that allocates from it
  Mesh gpu_mesh;                      // NCCL for the weights and gradients (a GPU run)
  std::unique_ptr<LlamaModel> model;
  AttentionOperator ring;  // ring attention over mesh().cp when parallel.cp > 1
  LoraConfig lora;
  std::unique_ptr<Fp8Scaling> fp8;  // [fp8] enabled: the block linears' scales
  std::unique_ptr<Zero3Parameters> params;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<PerLayerUpdates> per_layer;  // optim.update = per_layer; null otherwise
  LrSchedule schedule;
  std::vector<std::unique_ptr<Stateful>> states;  // the parts only checkpoints know of
  std::unique_ptr<CheckpointManager> checkpoints;
};

}  // namespace frugal
