// The training loop. One optimizer step:
//   zero grads; for each micro-batch: forward + backward (gradients of the mean loss over the
//   step's counted tokens); global-norm clip; AdamW; log; maybe evaluate; maybe checkpoint.
#include "train/trainer.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint_dir.h"
#include "core/log.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "model/sampling.h"
#include "monitor/metrics.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

Batch to_model_batch(const TokenBatch& tokens) {
  Batch b;
  b.batch = tokens.inputs.size(0);
  b.seq = tokens.inputs.size(1);
  b.tokens = tokens.inputs.view({b.batch * b.seq});
  b.targets = tokens.targets.view({b.batch * b.seq});
  b.positions = sequence_positions(b.batch, b.seq);
  return b;
}

// Mean validation loss over (at most eval_batches of) the validation split.
double evaluate(LlamaModel& model, ParameterProvider& params, const TokenFile& val,
                const TrainConfig& c) {
  EvalIterator it(val.view(), c.train.seq_len, c.train.micro_batch_size, 0, 1,
                  c.train.eval_batches);
  TokenBatch tokens;
  double loss_sum = 0;
  int64_t counted = 0;
  while (it.next(tokens)) {
    Batch b = to_model_batch(tokens);
    loss_sum += model.forward_loss(b, params);
    counted += counted_targets(b.targets);
  }
  if (counted == 0)
    fail("the validation split of '", c.data.dir,
         "' holds no window of train.seq_len = ", c.train.seq_len, " + 1 tokens");
  return loss_sum / double(counted);
}

void save_checkpoint(const CheckpointDir& dir, int64_t step, LocalParameters& params, AdamW& opt,
                     const BatchSampler& sampler, const TrainConfig& c) {
  std::vector<NamedTensor> tensors;
  for (size_t i = 0; i < opt.shards().size(); ++i) {
    const TrainableShard& s = opt.shards()[i];
    tensors.push_back({"model/" + s.name, s.param});
    tensors.push_back({"optim/exp_avg/" + s.name, opt.first_moment(i)});
    tensors.push_back({"optim/exp_avg_sq/" + s.name, opt.second_moment(i)});
  }
  nlohmann::json manifest = {
      {"format", "frugal-checkpoint-1"},
      {"step", step},
      {"world_size", 1},
      {"model", llama_config_to_json(c.model)},
      {"sampler", {{"epoch", sampler.state().epoch}, {"position", sampler.state().position}}},
      {"config", c.resolved}};
  dir.save_rank(step, 0, tensors, manifest);
  dir.commit(step, c.ckpt.keep);
}

int64_t load_checkpoint(const CheckpointDir& dir, int64_t step, LocalParameters& params, AdamW& opt,
                        BatchSampler& sampler, const TrainConfig& c) {
  CheckpointDir::Loaded loaded = dir.load_rank(step, 0);
  if (loaded.manifest.at("model") != llama_config_to_json(c.model))
    fail("checkpoint step ", step, " in '", dir.step_dir(step), "' has model ",
         loaded.manifest.at("model").dump(), " but the config asks for ",
         llama_config_to_json(c.model).dump());
  auto find = [&](const std::string& name) -> const Tensor& {
    for (const NamedTensor& t : loaded.tensors)
      if (t.name == name) return t.tensor;
    fail("checkpoint '", dir.rank_file(step, 0), "' has no tensor '", name, "'");
  };
  for (size_t i = 0; i < opt.shards().size(); ++i) {
    const TrainableShard& s = opt.shards()[i];
    Tensor param = s.param;
    param.copy_from(find("model/" + s.name));
    opt.first_moment(i).copy_from(find("optim/exp_avg/" + s.name));
    opt.second_moment(i).copy_from(find("optim/exp_avg_sq/" + s.name));
  }
  SamplerState state;
  state.epoch = loaded.manifest.at("sampler").at("epoch").get<uint64_t>();
  state.position = loaded.manifest.at("sampler").at("position").get<uint64_t>();
  sampler.restore(state);
  return loaded.manifest.at("step").get<int64_t>();
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}
std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

TrainSummary run_training(const TrainConfig& c) {
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
  BatchSampler sampler(train_tokens.view(), sampler_config);

  // --- model and optimizer -------------------------------------------------------------------
  fs::create_directories(c.train.out_dir);
  LlamaModel model(c.model);
  LocalParameters params(c.model, c.train.seed, static_cast<float>(c.train.init_std), true);
  AdamWConfig adamw_config{c.optim.beta1, c.optim.beta2, c.optim.eps, c.optim.weight_decay,
                           c.optim.grad_clip};
  AdamW optimizer(params.trainable(), adamw_config);
  LrSchedule schedule{c.train.lr, c.train.warmup_steps, c.train.steps, c.train.min_lr_ratio};
  CheckpointDir ckpt_dir((fs::path(c.train.out_dir) / "ckpt").string());

  int64_t start_step = 0;
  if (c.train.resume) {
    if (std::optional<int64_t> latest = ckpt_dir.latest()) {
      start_step = load_checkpoint(ckpt_dir, *latest, params, optimizer, sampler, c);
      log_info("resumed from step ", start_step, " (", ckpt_dir.step_dir(*latest), ")");
    } else {
      log_info("train.resume: no committed checkpoint under ", c.train.out_dir,
               "/ckpt, starting from scratch");
    }
  }
  MetricsWriter metrics((fs::path(c.train.out_dir) / "metrics.jsonl").string(), start_step > 0);
  // The run directory is self-contained: eval, generate and export need only it.
  fs::copy_file(data_dir / "tokenizer.model", fs::path(c.train.out_dir) / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  {
    std::ofstream config_out(fs::path(c.train.out_dir) / "train_config.json");
    config_out << nlohmann::json(c.resolved).dump(2) << "\n";
  }

  const int64_t tokens_per_step =
      c.train.micro_batch_size * c.train.seq_len * c.train.grad_accum_steps;
  log_info("frugal train: model ", c.model.parameter_count(), " parameters (",
           c.model.num_hidden_layers, " layers, hidden ", c.model.hidden_size, ", heads ",
           c.model.num_attention_heads, "/", c.model.num_key_value_heads, ", vocab ",
           c.model.vocab_size, ")");
  log_info("data: ", train_tokens.size(), " training tokens, ", val_tokens.size(),
           " validation tokens; ", tokens_per_step, " tokens per step; steps ", start_step + 1,
           "..", c.train.steps, "; checkpointing ",
           checkpoint_policy_name(c.train.activation_checkpointing));

  TrainSummary summary;
  summary.first_val_loss = evaluate(model, params, val_tokens, c);
  log_info("step ", start_step, " | val_loss ", fixed(summary.first_val_loss, 4));
  if (start_step == 0) metrics.write({{"step", 0}, {"val_loss", summary.first_val_loss}});
  summary.final_val_loss = summary.first_val_loss;

  // --- the loop --------------------------------------------------------------------------------
  const double loop_start = now_seconds();
  double window_start = loop_start;
  int64_t window_tokens = 0;
  for (int64_t step = start_step + 1; step <= c.train.steps; ++step) {
    const double step_start = now_seconds();
    const double lr = schedule.at(step);
    params.zero_grads();
    std::vector<Batch> micro;
    int64_t counted = 0;
    for (int64_t m = 0; m < c.train.grad_accum_steps; ++m) {
      micro.push_back(to_model_batch(sampler.next()));
      counted += counted_targets(micro.back().targets);
    }
    const float grad_scale = 1.0f / float(std::max<int64_t>(1, counted));
    double loss_sum = 0;
    for (const Batch& b : micro)
      loss_sum += model.forward_backward(b, params, grad_scale, c.train.activation_checkpointing);
    const double loss = loss_sum / double(std::max<int64_t>(1, counted));
    if (!std::isfinite(loss))
      fail("training loss became ", loss, " at step ", step,
           "; try a lower train.lr or a stronger optim.grad_clip");
    AdamW::StepReport report = optimizer.step(lr, step, [](double local) { return local; });

    const double step_seconds = now_seconds() - step_start;
    window_tokens += tokens_per_step;
    nlohmann::json record = {{"step", step},
                             {"loss", loss},
                             {"lr", lr},
                             {"grad_norm", report.grad_norm},
                             {"tokens_per_s", double(tokens_per_step) / step_seconds},
                             {"peak_memory_bytes", host_arena().stats().peak_bytes}};
    const bool last = step == c.train.steps;
    if (last || (c.train.eval_every > 0 && step % c.train.eval_every == 0)) {
      summary.final_val_loss = evaluate(model, params, val_tokens, c);
      record["val_loss"] = summary.final_val_loss;
    }
    metrics.write(record);

    if (step % c.monitor.log_every == 0 || last || record.contains("val_loss")) {
      const double now = now_seconds();
      const double rate = window_tokens / std::max(1e-9, now - window_start);
      const double eta = (c.train.steps - step) * (now - loop_start) / double(step - start_step);
      std::string line = "step " + std::to_string(step) + "/" + std::to_string(c.train.steps) +
                         " | loss " + fixed(loss, 4) + " | lr " + sci(lr) + " | grad " +
                         fixed(report.grad_norm, 3) + " | " + fixed(rate, 0) + " tok/s | ETA " +
                         format_duration(eta);
      if (record.contains("val_loss")) line += " | val_loss " + fixed(summary.final_val_loss, 4);
      log_info(line);
      window_start = now;
      window_tokens = 0;
    }
    if (last || (c.ckpt.every > 0 && step % c.ckpt.every == 0)) {
      save_checkpoint(ckpt_dir, step, params, optimizer, sampler, c);
      log_info("checkpoint: ", ckpt_dir.step_dir(step));
    }
  }
  summary.steps_done = c.train.steps - start_step;
  const double elapsed = now_seconds() - loop_start;
  summary.tokens_per_s = summary.steps_done * double(tokens_per_step) / std::max(1e-9, elapsed);
  log_info("done: ", summary.steps_done, " steps in ", format_duration(elapsed), ", ",
           fixed(summary.tokens_per_s, 0), " tok/s; val_loss ", fixed(summary.first_val_loss, 4),
           " -> ", fixed(summary.final_val_loss, 4), "; peak host memory ",
           fixed(host_arena().stats().peak_bytes / 1048576.0, 1), " MiB");

  if (c.train.sample_tokens > 0) {
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
