// Everything a training run is configured by, one struct per .cfg section. The app layer
// fills it from .cfg files and --section.key=value overrides (app/options.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "model/checkpoint_policy.h"
#include "model/llama_config.h"

namespace frugal {

struct DataConfig {
  std::string dir =
      "data/fortunes";  // made by `frugal prepare`: train.tok, val.tok, tokenizer.model
};

struct TrainSettings {
  // full: every weight trains; lora: the base is frozen and LoRA adapters train ([lora]).
  std::string type = "full";
  int64_t steps = 300;
  uint64_t seed = 1234;
  std::string out_dir = "out/tiny";
  double lr = 3e-3;
  int64_t warmup_steps = 30;
  double min_lr_ratio = 0.1;  // cosine decays from lr to lr * min_lr_ratio
  int64_t micro_batch_size = 8;
  int64_t grad_accum_steps = 1;
  int64_t seq_len = 128;
  int64_t eval_every = 50;    // 0: only at the end
  int64_t eval_batches = 16;  // validation micro-batches per evaluation (0: the whole split)
  double init_std = 0.02;
  CheckpointPolicy activation_checkpointing = CheckpointPolicy::none;
  bool resume = false;
  int64_t sample_tokens = 48;  // tokens generated at the end as a sample (0: none)
  std::string sample_prompt = "The ";
};

struct LoraSettings {
  int64_t rank = 16;
  double alpha = 32;            // the update is scaled by alpha / rank
  double dropout = 0;           // on each adapter's input while training
  std::string targets = "all";  // all, or a list: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
};

struct OptimConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // global-norm clip; 0 disables
  // fp32: master weights, gradient shards and moments in fp32 (bf16 copies for compute on a
  // GPU); bf16 (GPU only): all of them in bf16, like a bf16 PyTorch model with AdamW.
  std::string state_dtype = "fp32";
};

struct ParallelConfig {
  // none: everything on the compute device; optimizer: AdamW moments (and the gradient shards
  // they consume) in host memory; params: the fp32 master shards too.
  std::string offload = "none";
  double timeout_s = 300;  // a collective waiting longer ends the run with an error
  int64_t cp = 1;          // context-parallel ranks: each sequence is split over them (ring
                           // attention); the data-parallel ranks are the rest
  std::string device = "auto";      // auto (a GPU when there is one) | cpu | cuda
  std::string gpu_mem_limit = "0";  // cap on this rank's GPU memory, e.g. 24GiB (0: the card)

  size_t gpu_mem_limit_bytes() const;  // parsed, throws Error naming the key
};

struct CkptConfig {
  int64_t every = 0;  // save every N steps (0: only at the end)
  int64_t keep = 2;   // committed checkpoints kept (older ones deleted)
  bool final = true;  // save after the last step (benchmarks turn it off)
};

struct MonitorConfig {
  int64_t log_every = 10;  // progress lines; metrics.jsonl gets every step
};

struct TrainConfig {
  LlamaConfig model;
  // A Hugging Face model directory to start from: its config.json replaces the [model] shape
  // and its weights the initialisation (full fine-tune).
  std::string model_hf_path;
  DataConfig data;
  TrainSettings train;
  LoraSettings lora;
  OptimConfig optim;
  ParallelConfig parallel;
  CkptConfig ckpt;
  MonitorConfig monitor;
  // Every key with the value in force ("train.lr" -> "0.003"), for logs and checkpoints.
  std::map<std::string, std::string> resolved;

  void validate() const;                  // throws Error naming the key
  void validate_model_dependent() const;  // the checks that need the model's shape
};

}  // namespace frugal
