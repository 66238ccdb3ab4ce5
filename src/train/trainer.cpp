// The training loop on every rank. ZeRO-3 shards the model over all ranks (one rank is the
// degenerate case of the same code); each rank reads its own rows of every global batch.
#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>

#include "core/atomic_file.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "model/sampling.h"
#include "monitor/fp8_rates.h"
#include "monitor/metrics.h"
#include "monitor/tensorboard.h"
#include "ops/ops.h"
#include "parallel/ring_attention.h"
#include "train/health_monitor.h"
#include "train/train_step.h"
#include "train/training_run.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

// The casts' counts since the last report, as the monitor's tallies (this rank's casts).
std::vector<CastTally> fp8_tallies(const std::vector<Fp8Scaling::Counts>& counts) {
  std::vector<CastTally> out;
  for (const Fp8Scaling::Counts& c : counts)
    out.push_back({c.layer, std::string(enum_name(c.role)), c.values, c.flushed, c.saturated});
  return out;
}

// What a step's packed windows hold, for metrics.jsonl's "packing": documents per window and the
// share of causal attention's tiles that their masks skip (averaged over every rank's windows).
struct PackedStepTally {
  int64_t windows = 0, documents = 0;
  double skipped_tiles = 0;  // summed over the windows

  void add(const TokenBatch& tokens) {
    if (!tokens.document_start.defined()) return;
    const int64_t rows = tokens.document_start.size(0), seq = tokens.document_start.size(1);
    const int32_t* start = tokens.document_start.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r)
      skipped_tiles += skipped_attention_tiles({start + r * seq, size_t(seq)});
    windows += rows;
    documents += tokens.documents;
  }
  // A collective over `world`: every rank calls it (each with windows > 0, or none does).
  nlohmann::json record(Comm& world) const {
    // The cp ranks of a group read the same windows: counting them again changes no mean.
    const double all_windows = world.all_reduce_sum(double(windows));
    return {{"documents_per_window", world.all_reduce_sum(double(documents)) / all_windows},
            {"attention_tiles_skipped", world.all_reduce_sum(skipped_tiles) / all_windows}};
  }
};

// The model's batch of this rank: whole sequences, or with context parallelism this rank's
// zigzag share of each.
Batch to_model_batch(const TokenBatch& tokens, const Mesh& mesh) {
  Batch b;
  b.batch = tokens.inputs.size(0);
  b.seq = tokens.inputs.size(1);
  b.tokens = tokens.inputs.view({b.batch * b.seq});
  b.targets = tokens.targets.view({b.batch * b.seq});
  if (tokens.document_start.defined()) {
    // Packed documents: rotary positions restart at each document's first row.
    const int64_t rows = b.batch * b.seq;
    b.documents.start = tokens.document_start.view({rows});
    b.documents.end = tokens.document_end.view({rows});
    b.positions = Tensor::empty({rows}, DType::i32);
    const int32_t* start = b.documents.start.data<int32_t>();
    int32_t* positions = b.positions.data<int32_t>();
    for (int64_t t = 0; t < rows; ++t) positions[t] = int32_t(t % b.seq) - start[t];
  } else {
    b.positions = sequence_positions(b.batch, b.seq);
  }
  if (mesh.cp_size == 1) return b;
  return context_parallel_slice(b, zigzag_layout(b.seq, mesh.cp_size, mesh.cp_rank));
}

// Mean validation loss over (at most eval_batches per rank of) the validation split.
double evaluate(LlamaModel& model, ParameterProvider& params, const TokenFile& val,
                const TrainingData& data, const TrainConfig& c, const Mesh& mesh) {
  Comm& world = *mesh.world;
  const TargetSelection& targets = data.val_targets;
  EvalIterator it(val.view(), c.train.seq_len, c.train.micro_batch_size, mesh.dp_rank, mesh.dp_size,
                  c.train.eval_batches, targets, data.val_windows.get());
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
         "' holds no window of train.seq_len = ", c.train.seq_len, " + 1 tokens",
         targets.roles ? " with a target data.train_on trains" : "");
  const double loss = world.all_reduce_sum(loss_sum) / total;
  // metrics.jsonl would hold null, and the run would end as if all were well.
  if (!std::isfinite(loss))
    fail("the validation loss is ", loss, "; the weights overflow the forward pass or are not ",
         "finite (try a lower train.lr or a stronger optim.grad_clip)");
  return loss;
}

// The signal any rank received (SIGUSR1, SIGTERM), the same on every rank; 0 when none did.
// One small all-reduce per step, in this one place: a signal may reach one rank only, or reach
// the ranks while they are in different steps, and every rank must stop after the same step.
int stop_signal_on_any_rank(const std::atomic<int>* stop_signal, Comm& world) {
  return int(world.all_reduce_max(stop_signal ? stop_signal->load() : 0));
}

// The end of a run stopped by `signal` after `step` (every rank agreed on it): save that step
// unless it was just saved (`saved_step`), wait until the save is committed on every rank (an
// asynchronous one too), then say how to go on; each rank may exit right after.
void stop_after_signal(TrainingRun& run, int signal, int64_t step, int64_t saved_step) {
  const std::string name = signal_name(signal);
  if (step == 0) {
    log_info("stopped by ", name, " before the first step: nothing to save; start again with ",
             "train.resume=true");
    return;
  }
  if (step > saved_step) run.checkpoints->save(step);
  run.checkpoints->finish();  // an asynchronous save on disk and committed before the exit
  log_info("stopped by ", name, " at step ", step, ": checkpoint ",
           run.checkpoints->dir().step_dir(step), ", resume with train.resume=true");
}

std::string fixed(double v, int digits) {
  if (std::isnan(v)) return "nan";  // printf says "-nan" for some NaNs: the sign means nothing
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// The commit of a save, once it happened: what it wrote, into the step's record and the log.
void report_commit(CheckpointManager& checkpoints, nlohmann::json& record) {
  const std::optional<CheckpointManager::Committed> done = checkpoints.take_committed();
  if (!done) return;
  record["checkpoint"] = {{"step", done->step},
                          {"bytes", done->bytes},
                          {"stage_seconds", done->stage_seconds},
                          {"write_seconds", done->write_seconds}};
  log_info("checkpoint: step ", done->step, " committed: ", mib(done->bytes),
           " per rank written in ", fixed(done->write_seconds, 2), " s (",
           fixed(double(done->bytes) / 1048576.0 / std::max(1e-9, done->write_seconds), 0),
           " MiB/s)");
}

}  // namespace

TrainSummary run_training(const TrainConfig& config, const FaultInjection& fault,
                          const std::atomic<int>* stop_signal) {
  TrainingRun run(config);
  const TrainConfig& c = run.config;
  Mesh& mesh = run.mesh();
  Comm& world = run.world();
  const int rank = world.rank();
  LlamaModel& model = *run.model;
  Zero3Parameters& params = *run.params;
  const TokenFile& val_tokens = *run.val_tokens;

  int64_t start_step = 0;
  world.barrier();  // rank 0 may have just created out_dir
  if (c.train.resume)
    start_step = run.checkpoints->resume();
  else
    run.checkpoints->start_afresh();  // an earlier run's checkpoints are kept aside
  TrainSummary summary;
  if (start_step >= c.train.steps) {
    // A finished run resubmitted (a job requeued after its last step, say): nothing changes.
    const std::string relation = start_step == c.train.steps
                                     ? " = train.steps"
                                     : " > train.steps = " + std::to_string(c.train.steps);
    log_info("the run already reached step ", start_step, relation, "; nothing to train");
    return summary;
  }
  std::optional<MetricsWriter> metrics;
  std::optional<TensorBoardWriter> tensorboard;  // monitor.tensorboard
  // A finished record of metrics.jsonl, and the same numbers as TensorBoard scalars.
  const auto write_record = [&metrics, &tensorboard](const nlohmann::json& record) {
    if (metrics) metrics->write(record);
    if (tensorboard) tensorboard->write(record);
  };
  if (rank == 0) {
    const fs::path metrics_path = fs::path(c.train.out_dir) / "metrics.jsonl";
    if (start_step > 0) truncate_metrics(metrics_path, start_step);
    metrics.emplace(metrics_path.string(), start_step > 0);
    // A resumed run's event file replaces what an interrupted one wrote after the checkpoint.
    if (!c.monitor.tensorboard.empty())
      tensorboard.emplace(c.monitor.tensorboard, start_step > 0 ? start_step + 1 : 0);
    // The run directory is self-contained: eval, generate and export need only it.
    copy_tokenizer(run.tokenizer->path(), c.train.out_dir);  // whole files, or none changed
    // Replaced whole: a full disk must not leave a resumed run's directory without it.
    replace_file((fs::path(c.train.out_dir) / "train_config.json").string(),
                 nlohmann::json(c.resolved).dump(2) + "\n");
  }

  const int64_t tokens_per_step = run.tokens_per_step();
  run.log_plan(start_step);

  summary.first_val_loss = evaluate(model, params, val_tokens, run.data, c, mesh);
  log_info("step ", start_step, " | val_loss ", fixed(summary.first_val_loss, 4));
  if (start_step == 0) write_record({{"step", 0}, {"val_loss", summary.first_val_loss}});
  summary.final_val_loss = summary.first_val_loss;

  // A signal during start-up (loading, resuming, the first evaluation) stops the run before
  // it trains a step.
  int64_t saved_step = start_step;  // the newest step saved (committed, or being written)
  if (const int signal = stop_signal_on_any_rank(stop_signal, world)) {
    stop_after_signal(run, signal, start_step, saved_step);
    summary.stopped_by_signal = signal;
    return summary;
  }

  // --- the loop --------------------------------------------------------------------------------
  HealthMonitor health(run, fault);
  const double loop_start = now_seconds();
  double window_start = loop_start;
  int64_t window_tokens = 0;
  double lr_factor = 1;  // lowered by a rollback, up to step lowered_until
  int64_t lowered_until = 0;
  std::set<int64_t> skipped_steps;     // steps whose batches a rollback skips when they come again
  int64_t furthest_step = start_step;  // faults fire only the first time a step runs
  for (int64_t step = start_step + 1; step <= c.train.steps; ++step) {
    const bool first_pass = step > furthest_step;
    furthest_step = std::max(furthest_step, step);
    const double step_start = now_seconds();
    inject_fault(fault, rank, step);  // (a slow rank's sleep counts in its step)
    double lr = run.schedule.at(step) * (step <= lowered_until ? lr_factor : 1.0);
    if (first_pass && fault.at(FaultInjection::Kind::spike, rank, step)) {
      std::fprintf(stderr, "frugal: rank %d: injected fault 'spike' at step %lld\n", rank,
                   static_cast<long long>(step));
      lr *= 1000;
    }
    std::vector<Batch> micro;
    PackedStepTally packed;
    for (int64_t m = 0; m < c.train.grad_accum_steps; ++m) {
      // A batch a rollback skips is drawn and dropped, so every later step sees the batch it
      // would have seen.
      if (skipped_steps.count(step)) run.sampler->next();
      const TokenBatch tokens = run.sampler->next();
      packed.add(tokens);
      micro.push_back(to_model_batch(tokens, mesh));
    }
    // The bytes this step's collectives move, by link class (the evaluation's not among them).
    if (mesh.traffic) mesh.traffic->reset();
    StepComms comms;
    comms.world = &world;
    comms.shard = mesh.shard.get();
    comms.replica = mesh.replica.get();
    comms.host_shard = run.host_mesh.shard.get();
    comms.host_replica = run.host_mesh.replica.get();
    // FP8 weight gathers for the step's GEMMs only: evaluation reads the weights as they are.
    params.set_fp8_gathers(true);
    StepResult result;
    try {
      result = train_step(model, params, *run.optimizer, micro, comms, lr, step,
                          c.train.activation_checkpointing, health.hooks(step, first_pass),
                          run.per_layer.get());
    } catch (const NothingToTrain& e) {
      // Every window the step drew lies in prompts (data.train_on leaves them no target).
      fail(e.what(), ": the windows it drew from '", (fs::path(c.data.dir) / "train.tok").string(),
           "' hold no target that data.train_on = ", enum_name(c.data.train_on),
           " trains (see the count of such windows at the start); a larger global batch, a longer ",
           "train.seq_len or data.train_on = all avoids it");
    }
    params.set_fp8_gathers(false);
    nlohmann::json link_bytes = nlohmann::json::object();
    for (LinkClass link : {LinkClass::intra_node, LinkClass::inter_node})
      link_bytes[link_class_name(link)] = mesh.traffic ? mesh.traffic->bytes(link) : 0;
    // FP8: the amaxes of the step agree over the data-parallel ranks (they read different
    // data; cp ranks' halves of a sequence keep their own), then the delayed scales move (a
    // non-finite amax of a skipped step keeps its scale).
    // With FP8 weight gathers each rank casts only its rows of a weight: the weights' amaxes
    // agree over the ranks that shard them too (with cp ranks among them, the dp group alone
    // would leave two scales for one tensor's codes).
    const bool weights_over_shard = params.has_fp8_gathers() && mesh.cp->size() > 1;
    if (run.fp8)
      run.fp8->end_step(
          [&mesh](Tensor& amax) {
            if (mesh.dp->size() > 1) mesh.dp->all_reduce_max(amax)->wait();
          },
          [&mesh, weights_over_shard](Tensor& amax) {
            if (weights_over_shard) mesh.shard->all_reduce_max(amax)->wait();
          });

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
                             {"link_bytes", link_bytes},
                             {"peak_memory_bytes", run.memory->peak_bytes()},
                             {"memory", run.memory->report()}};
    record["trained_tokens"] = result.tokens;  // the loss's denominator (masks left out)
    if (packed.windows > 0) record["packing"] = packed.record(world);
    if (!std::isfinite(result.loss)) record["loss"] = nullptr;
    if (!std::isfinite(result.grad_norm)) record["grad_norm"] = nullptr;
    if (!result.applied) record["skipped"] = true;
    if (result.partly_applied) {
      // Per-layer updates: the units above the non-finite one were updated before it was seen.
      record["partly_applied"] = {{"units_updated", result.units_updated}, {"units", result.units}};
      if (rank == 0)
        log_warn("step ", step, ": per-layer updates: ", result.units_updated, " of ", result.units,
                 " units were updated before unit ", result.first_nonfinite_unit,
                 "'s gradients were found non-finite; it and the units after it kept their "
                 "weights and state");
    }
    if (record["memory"].contains("device_peak_bytes"))  // a GPU run
      record["device_peak_bytes"] = record["memory"]["device_peak_bytes"];
    // Host memory as the operating system saw it: every rank's peak resident set, summed (the
    // bound a node holding all the ranks must have; what offload and loading cost in RAM).
    record["host_peak_rss_bytes"] = world.all_reduce_sum(double(peak_resident_bytes()));
    health.after_step(step, step_seconds, record);

    if (health.verdict() == HealthMonitor::Verdict::rollback) {
      // Back to the newest checkpoint before the damage, with a lower LR, and without this
      // step's batch when it comes again.
      if (health.counts().rollbacks >= c.monitor.max_rollbacks)
        fail("training diverged at step ", step, " (", health.verdict_reason(), ") after ",
             health.counts().rollbacks, " rollbacks (monitor.max_rollbacks); try a lower train.lr");
      run.checkpoints->finish();
      const int64_t back_to = run.checkpoints->resume(health.rollback_before());
      if (back_to > 0) {
        lr_factor = (step <= lowered_until ? lr_factor : 1.0) * c.monitor.rollback_lr_factor;
        lowered_until =
            c.monitor.rollback_lr_steps > 0 ? back_to + c.monitor.rollback_lr_steps : c.train.steps;
        skipped_steps.insert(step);
        health.rolled_back_to(back_to);
        saved_step = std::min(saved_step, back_to);
        if (rank == 0)
          log_warn("step ", step, ": ", health.verdict_reason(), "; rolled back to step ", back_to,
                   ", the learning rate x", lr_factor, " up to step ", lowered_until,
                   ", this step's batch to be skipped");
        if (metrics) {
          metrics.reset();
          const fs::path metrics_path = fs::path(c.train.out_dir) / "metrics.jsonl";
          truncate_metrics(metrics_path, back_to);
          metrics.emplace(metrics_path.string(), true);
          if (tensorboard) tensorboard->restart_at(back_to + 1);
          write_record({{"step", back_to},
                        {"rollback",
                         {{"from_step", step},
                          {"reason", health.verdict_reason()},
                          {"lr_factor", lr_factor}}}});
        }
        step = back_to;
        window_start = now_seconds();
        window_tokens = 0;
        continue;
      }
      if (rank == 0)
        log_warn("step ", step, ": ", health.verdict_reason(),
                 "; no checkpoint before it to roll back to: its batch is skipped instead");
    }

    const bool last = step == c.train.steps;
    if (run.fp8 && (step % c.monitor.log_every == 0 || last))
      record["fp8"] = fp8_rates_record(fp8_tallies(run.fp8->take_counts()));
    if (step % c.monitor.log_every == 0 || last)
      if (nlohmann::json profile = run.optimizer->take_profile(); !profile.is_null())
        record["galore_profile"] = std::move(profile);
    if (last || (c.train.eval_every > 0 && step % c.train.eval_every == 0)) {
      summary.final_val_loss = evaluate(model, params, val_tokens, run.data, c, mesh);
      record["val_loss"] = summary.final_val_loss;
    }
    // Checkpoints: a background save every rank has written is committed; a due one starts
    // (and training waits only for the copies when saves are asynchronous). A step is never
    // committed before its record is on disk in metrics.jsonl, so a resume always finds the
    // records up to the step it resumes from: an asynchronous save commits at a later poll,
    // after the record of its step; a synchronous one commits inside save(), so it starts once
    // the record is written, and its commit shows in the next step's record.
    run.checkpoints->poll();
    report_commit(*run.checkpoints, record);
    const bool save_due = (last && c.ckpt.final) || (c.ckpt.every > 0 && step % c.ckpt.every == 0);
    const auto save = [&] {
      const double save_start = now_seconds();
      run.checkpoints->save(step);
      saved_step = step;
      log_info("checkpoint: ", run.checkpoints->dir().step_dir(step),
               run.checkpoints->in_flight() ? " (being written; training goes on)" : "");
      return now_seconds() - save_start;
    };
    if (save_due && run.checkpoints->asynchronous()) record["seconds"]["checkpoint"] = save();
    write_record(record);
    if (metrics && save_due) metrics->sync();
    if (save_due && !run.checkpoints->asynchronous()) save();

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
    // A signal during the last step lets the run finish as usual.
    const int signal = last ? 0 : stop_signal_on_any_rank(stop_signal, world);
    if (signal) {
      if (metrics) metrics->sync();  // before the stop's save can commit this step
      stop_after_signal(run, signal, step, saved_step);
      summary.steps_done = step - start_step;
      summary.stopped_by_signal = signal;
      return summary;
    }
  }
  run.checkpoints->finish();  // the last save on disk and committed before the run ends
  nlohmann::json last_commit;
  report_commit(*run.checkpoints, last_commit);
  summary.steps_done = c.train.steps - start_step;
  const double elapsed = now_seconds() - loop_start;
  summary.tokens_per_s = summary.steps_done * double(tokens_per_step) / std::max(1e-9, elapsed);
  const nlohmann::json report = run.memory->report();
  log_info("done: ", summary.steps_done, " steps in ", format_duration(elapsed), ", ",
           fixed(summary.tokens_per_s, 0), " tok/s; val_loss ", fixed(summary.first_val_loss, 4),
           " -> ", fixed(summary.final_val_loss, 4));
  summary.health = health.counts();
  log_info(run_summary_table(
      {{"steps", std::to_string(summary.steps_done) + " (" + std::to_string(start_step + 1) +
                     " to " + std::to_string(c.train.steps) + ")"},
       {"time", format_duration(elapsed)},
       {"tokens_per_s", fixed(summary.tokens_per_s, 0)},
       {"val_loss", fixed(summary.first_val_loss, 4) + " -> " + fixed(summary.final_val_loss, 4)},
       {"peak_memory", mib(run.memory->peak_bytes())}},
      summary.health));
  log_info("memory per rank: parameters ", mib(report["parameters_bytes"]), ", gradients ",
           mib(report["gradients_bytes"]), ", optimizer ", mib(report["optimizer_bytes"]),
           ", gathered peak ", mib(report["gathered_peak_bytes"]),
           report.contains("activations_peak_bytes")
               ? ", activations peak " + mib(report["activations_peak_bytes"])
               : ", device peak in use " + mib(report["device_peak_in_use_bytes"]) +
                     " (all the GPU held at once, not only activations)");
#ifdef FRUGAL_HAVE_CUDA
  if (run.memory->gpu)
    log_info("GPU ", run.memory->gpu->device(), ": ",
             run.memory->gpu->device_memory().usage_report());
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
    sampling.stop_tokens = {run.tokenizer->eos_id()};
    std::vector<int32_t> prompt = run.tokenizer->encode(c.train.sample_prompt);
    // What precedes a document in training: bos, or without one the previous document's eos.
    const int32_t start =
        run.tokenizer->bos_id() >= 0 ? run.tokenizer->bos_id() : run.tokenizer->eos_id();
    prompt.insert(prompt.begin(), start);
    std::vector<int32_t> out = generate(model, params, prompt, sampling);
    log_info("sample: ", run.tokenizer->decode(out));
  }
  return summary;
}

}  // namespace frugal
