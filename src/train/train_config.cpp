// Cross-key validation of a training configuration.
#include "train/train_config.h"

#include "core/log.h"
#include "model/lora.h"

namespace frugal {

void TrainConfig::validate_model_dependent() const {
  model.validate();
  if (train.seq_len > model.max_position_embeddings)
    fail("config key 'train.seq_len': ", train.seq_len,
         " exceeds model.max_position_embeddings = ", model.max_position_embeddings);
}

void TrainConfig::validate() const {
  // With model.hf_path the shape comes from config.json: checked once it is read.
  if (model_hf_path.empty()) validate_model_dependent();
  auto positive = [](const char* key, int64_t v) {
    if (v <= 0) fail("config key '", key, "': value ", v, " must be positive");
  };
  positive("train.steps", train.steps);
  if (train.type != "full" && train.type != "lora" && train.type != "qlora" &&
      train.type != "hqq_lora")
    fail("config key 'train.type': value '", train.type,
         "' is not one of full, lora, qlora, hqq_lora");
  if (train.type != "full") {
    if (lora.rank < 1) fail("config key 'lora.rank': value ", lora.rank, " must be >= 1");
    if (!(lora.alpha > 0)) fail("config key 'lora.alpha': value ", lora.alpha, " must be > 0");
    if (!(lora.dropout >= 0 && lora.dropout < 1))
      fail("config key 'lora.dropout': value ", lora.dropout, " must lie in [0, 1)");
    lora_targets_from_names(lora.targets);
  }
  positive("train.micro_batch_size", train.micro_batch_size);
  positive("train.grad_accum_steps", train.grad_accum_steps);
  positive("train.seq_len", train.seq_len);
  if (train.eval_every < 0)
    fail("config key 'train.eval_every': value ", train.eval_every, " must be >= 0");
  if (train.eval_batches < 0)
    fail("config key 'train.eval_batches': value ", train.eval_batches, " must be >= 0");
  if (!(train.lr > 0)) fail("config key 'train.lr': value ", train.lr, " must be > 0");
  if (train.warmup_steps < 0)
    fail("config key 'train.warmup_steps': value ", train.warmup_steps, " must be >= 0");
  if (!(train.min_lr_ratio >= 0 && train.min_lr_ratio <= 1))
    fail("config key 'train.min_lr_ratio': value ", train.min_lr_ratio, " must lie in [0, 1]");
  if (!(train.init_std > 0))
    fail("config key 'train.init_std': value ", train.init_std, " must be > 0");
  if (!(optim.beta1 >= 0 && optim.beta1 < 1))
    fail("config key 'optim.beta1': value ", optim.beta1, " must lie in [0, 1)");
  if (!(optim.beta2 >= 0 && optim.beta2 < 1))
    fail("config key 'optim.beta2': value ", optim.beta2, " must lie in [0, 1)");
  if (!(optim.eps > 0)) fail("config key 'optim.eps': value ", optim.eps, " must be > 0");
  if (!(optim.weight_decay >= 0))
    fail("config key 'optim.weight_decay': value ", optim.weight_decay, " must be >= 0");
  if (!(optim.grad_clip >= 0))
    fail("config key 'optim.grad_clip': value ", optim.grad_clip, " must be >= 0");
  if (optim.state_dtype != "fp32" && optim.state_dtype != "bf16")
    fail("config key 'optim.state_dtype': value '", optim.state_dtype, "' is not one of fp32, bf16");
  if (optim.state_dtype == "bf16" && parallel.device == "cpu")
    fail("config key 'optim.state_dtype': bf16 needs parallel.device = cuda (the CPU backend "
         "trains in fp32)");
  if (optim.state_dtype == "bf16" && parallel.offload != "none")
    fail("config key 'optim.state_dtype': bf16 works without offload (parallel.offload = ",
         parallel.offload, "): offload keeps the fp32 state on the host instead");
  if (parallel.offload != "none" && parallel.offload != "optimizer" && parallel.offload != "params")
    fail("config key 'parallel.offload': value '", parallel.offload,
         "' is not one of none, optimizer, params");
  if (parallel.cp < 1) fail("config key 'parallel.cp': value ", parallel.cp, " must be >= 1");
  if (parallel.device != "auto" && parallel.device != "cpu" && parallel.device != "cuda")
    fail("config key 'parallel.device': value '", parallel.device, "' is not one of auto, cpu, cuda");
  parallel.gpu_mem_limit_bytes();
  if (!(parallel.timeout_s > 0))
    fail("config key 'parallel.timeout_s': value ", parallel.timeout_s, " must be > 0");
  if (ckpt.every < 0) fail("config key 'ckpt.every': value ", ckpt.every, " must be >= 0");
  if (ckpt.keep < 1) fail("config key 'ckpt.keep': value ", ckpt.keep, " must be >= 1");
  if (monitor.log_every < 1)
    fail("config key 'monitor.log_every': value ", monitor.log_every, " must be >= 1");
  if (train.sample_tokens < 0)
    fail("config key 'train.sample_tokens': value ", train.sample_tokens, " must be >= 0");
}

size_t ParallelConfig::gpu_mem_limit_bytes() const {
  return parse_bytes(gpu_mem_limit, "parallel.gpu_mem_limit");
}

}  // namespace frugal
