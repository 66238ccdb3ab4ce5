// The table of every training key: name, default, meaning. Keep doc/usage.md in step.
#include "app/options.h"

#include <boost/program_options.hpp>
#include <charconv>
#include <fstream>
#include <functional>
#include <sstream>

namespace po = boost::program_options;

namespace frugal {

namespace {

// The shortest text that reads back as the same value ("0.003", not 0.0030000000000000001).
template <class T>
std::string text_of(const T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
    return std::string(buf, end);
  }
}

// Records, for each key, how to print the value in force.
class OptionTable {
 public:
  explicit OptionTable(TrainConfig& config) : config_(config) {}

  template <class T>
  void add(po::options_description& section, const std::string& key, T* field,
           const std::string& doc) {
    section.add_options()(key.c_str(), po::value<T>(field)->default_value(*field, text_of(*field)),
                          doc.c_str());
    printers_.emplace_back(key, [field] { return text_of(*field); });
  }

  void add_string(po::options_description& section, const std::string& key, std::string* field,
                  const std::string& doc) {
    section.add_options()(key.c_str(), po::value<std::string>(field)->default_value(*field),
                          doc.c_str());
    printers_.emplace_back(key, [field] { return *field; });
  }

  void resolve() {
    for (auto& [key, print] : printers_) config_.resolved[key] = print();
  }

 private:
  TrainConfig& config_;
  std::vector<std::pair<std::string, std::function<std::string()>>> printers_;
};

void describe(po::options_description& all, OptionTable& t, TrainConfig& c,
              std::string& checkpointing) {
  po::options_description model("[model] the Llama shape (Hugging Face key names)");
  t.add(model, "model.hidden_size", &c.model.hidden_size, "width of the residual stream");
  t.add(model, "model.intermediate_size", &c.model.intermediate_size, "width of the SwiGLU MLP");
  t.add(model, "model.num_hidden_layers", &c.model.num_hidden_layers, "transformer blocks");
  t.add(model, "model.num_attention_heads", &c.model.num_attention_heads, "query heads");
  t.add(model, "model.num_key_value_heads", &c.model.num_key_value_heads,
        "key/value heads (grouped-query attention when fewer than the query heads)");
  t.add(model, "model.vocab_size", &c.model.vocab_size,
        "vocabulary size; must match the tokenizer of data.dir");
  t.add(model, "model.head_dim", &c.model.head_dim, "head dimension (0: hidden_size / heads)");
  t.add(model, "model.max_position_embeddings", &c.model.max_position_embeddings,
        "longest sequence the model is meant for");
  t.add(model, "model.rope_theta", &c.model.rope_theta, "rotary embedding base");
  t.add(model, "model.rms_norm_eps", &c.model.rms_norm_eps, "RMSNorm epsilon");
  t.add(model, "model.tie_word_embeddings", &c.model.tie_word_embeddings,
        "share the embedding matrix with the output head");
  t.add_string(model, "model.hf_path", &c.model_hf_path,
               "start from this Hugging Face model directory (its config.json replaces the "
               "[model] shape; prepare data with its tokenizer.model)");

  po::options_description data("[data] the prepared corpus");
  t.add_string(data, "data.dir", &c.data.dir,
               "directory written by `frugal prepare` (train.tok, val.tok, tokenizer.model)");

  po::options_description train("[train] the run");
  t.add(train, "train.steps", &c.train.steps, "optimizer steps");
  t.add(train, "train.seed", &c.train.seed, "seed of initialisation and data order");
  t.add_string(train, "train.out_dir", &c.train.out_dir,
               "where metrics.jsonl, checkpoints and the final model go");
  t.add(train, "train.lr", &c.train.lr, "peak learning rate");
  t.add(train, "train.warmup_steps", &c.train.warmup_steps, "linear warm-up steps");
  t.add(train, "train.min_lr_ratio", &c.train.min_lr_ratio,
        "cosine decay ends at lr * min_lr_ratio");
  t.add(train, "train.micro_batch_size", &c.train.micro_batch_size,
        "sequences per micro-batch (per rank)");
  t.add(train, "train.grad_accum_steps", &c.train.grad_accum_steps,
        "micro-batches accumulated per optimizer step");
  t.add(train, "train.seq_len", &c.train.seq_len, "tokens per sequence");
  t.add(train, "train.eval_every", &c.train.eval_every,
        "evaluate on the validation split every N steps (0: only at the end)");
  t.add(train, "train.eval_batches", &c.train.eval_batches,
        "validation micro-batches per evaluation (0: the whole split)");
  t.add(train, "train.init_std", &c.train.init_std, "std of the normal initialisation");
  t.add_string(train, "train.type", &c.train.type,
               "full | lora | qlora | hqq_lora: train every weight, or freeze the base and "
               "train LoRA adapters ([lora]); qlora / hqq_lora keep the base's block "
               "projections in NF4 / HQQ 4-bit");
  t.add_string(train, "train.activation_checkpointing", &checkpointing,
               "none | selective | full: what a block keeps for its backward");
  t.add(train, "train.resume", &c.train.resume, "continue from out_dir/ckpt/LATEST when it exists");
  t.add(train, "train.sample_tokens", &c.train.sample_tokens,
        "tokens generated from sample_prompt at the end (0: none)");
  t.add_string(train, "train.sample_prompt", &c.train.sample_prompt, "prompt of the sample");

  po::options_description lora("[lora] adapters (train.type = lora)");
  t.add(lora, "lora.rank", &c.lora.rank, "rank r of each adapter (A [r, in], B [out, r])");
  t.add(lora, "lora.alpha", &c.lora.alpha, "the adapters' update is scaled by alpha / rank");
  t.add(lora, "lora.dropout", &c.lora.dropout,
        "dropout probability on each adapter's input while training (PEFT's lora_dropout)");
  t.add_string(lora, "lora.targets", &c.lora.targets,
               "all, or the projections that get adapters: q_proj,k_proj,v_proj,o_proj,"
               "gate_proj,up_proj,down_proj");

  po::options_description optim("[optim] AdamW and clipping");
  t.add(optim, "optim.beta1", &c.optim.beta1, "AdamW beta1");
  t.add(optim, "optim.beta2", &c.optim.beta2, "AdamW beta2");
  t.add(optim, "optim.eps", &c.optim.eps, "AdamW epsilon");
  t.add(optim, "optim.weight_decay", &c.optim.weight_decay,
        "decoupled weight decay (matrices only; norms are not decayed)");
  t.add(optim, "optim.grad_clip", &c.optim.grad_clip, "clip the global gradient norm (0: off)");
  t.add_string(optim, "optim.state_dtype", &c.optim.state_dtype,
               "fp32 | bf16: the dtype of master weights, gradients and AdamW moments (bf16: GPU "
               "only, 8 bytes per trainable weight instead of 18, as a bf16 PyTorch model)");

  po::options_description parallel(
      "[parallel] ranks, sharding and offload (ZeRO-3 over every rank)");
  t.add_string(parallel, "parallel.offload", &c.parallel.offload,
               "none | optimizer | params: what lives in host memory instead of the device");
  t.add(parallel, "parallel.cp", &c.parallel.cp,
        "context-parallel ranks: each sequence is split over them and attention runs as a ring "
        "(must divide the number of ranks; the rest are data-parallel)");
  t.add(parallel, "parallel.timeout_s", &c.parallel.timeout_s,
        "seconds a collective may wait for the other ranks before the run stops with an error");
  t.add_string(parallel, "parallel.device", &c.parallel.device,
               "auto | cpu | cuda: where the model runs, one GPU per rank (auto: the GPUs when "
               "every node has one for each of its ranks, else the CPU)");
  t.add_string(parallel, "parallel.gpu_mem_limit", &c.parallel.gpu_mem_limit,
               "cap on each rank's GPU memory, e.g. 24GiB to behave like a consumer card (0: the "
               "whole card); allocations past it stop the run naming what did not fit");

  po::options_description ckpt("[ckpt] checkpoints");
  t.add(ckpt, "ckpt.every", &c.ckpt.every, "save every N steps (0: only at the end)");
  t.add(ckpt, "ckpt.keep", &c.ckpt.keep, "committed checkpoints to keep");
  t.add(ckpt, "ckpt.final", &c.ckpt.final, "save a checkpoint after the last step");

  po::options_description monitor("[monitor] progress and metrics");
  t.add(monitor, "monitor.log_every", &c.monitor.log_every,
        "print a progress line every N steps (metrics.jsonl gets every step)");

  all.add(model).add(data).add(train).add(lora).add(optim).add(parallel).add(ckpt).add(monitor);
}

// "config key 'train.lr': the argument ('abc') for option 'train.lr' is invalid"
[[noreturn]] void rethrow_as_error(const po::error& e) {
  if (auto* named = dynamic_cast<const po::error_with_option_name*>(&e)) {
    std::string key = named->get_option_name();
    while (!key.empty() && key[0] == '-') key.erase(0, 1);
    key = key.substr(0, key.find('='));
    if (dynamic_cast<const po::unknown_option*>(&e))
      fail("unknown config key '", key, "' (see `frugal train --help` for every key)");
    if (!key.empty()) fail("config key '", key, "': ", e.what());
  }
  fail(e.what());
}

// "--section.key value" becomes "--section.key=value", and when a key is given more than
// once the last one wins (so a script can append overrides to a user's command line).
std::vector<std::string> last_override_wins(const std::vector<std::string>& args) {
  std::vector<std::string> merged;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool dotted_key = a.rfind("--", 0) == 0 && a.find('.') != std::string::npos &&
                            a.find('=') == std::string::npos;
    if (dotted_key && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0)
      merged.push_back(a + "=" + args[++i]);
    else
      merged.push_back(a);
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < merged.size(); ++i) {
    const std::string& a = merged[i];
    const size_t eq = a.find('=');
    bool overridden = false;
    if (a.rfind("--", 0) == 0 && eq != std::string::npos)
      for (size_t j = i + 1; j < merged.size(); ++j)
        overridden = overridden || merged[j].rfind(a.substr(0, eq + 1), 0) == 0;
    if (!overridden) out.push_back(a);
  }
  return out;
}

}  // namespace

TrainOptions parse_train_options(const std::vector<std::string>& raw_args) {
  const std::vector<std::string> args = last_override_wins(raw_args);
  TrainOptions out;
  TrainConfig& c = out.config;
  OptionTable table(c);
  po::options_description all("frugal train options");
  std::string checkpointing = checkpoint_policy_name(c.train.activation_checkpointing);
  describe(all, table, c, checkpointing);

  po::options_description cli("command line");
  std::vector<std::string> config_files;
  cli.add_options()("help,h", "print every key with its default and exit")(
      "config", po::value<std::vector<std::string>>(&config_files)->composing(),
      "a .cfg file (also accepted as a positional argument; later files win)");
  cli.add(all);
  po::positional_options_description positional;
  positional.add("config", -1);

  try {
    po::variables_map vm;
    // The command line is stored first, so its values win over the files'.
    po::store(po::command_line_parser(args).options(cli).positional(positional).run(), vm);
    if (vm.count("help")) {
      out.help = true;
      return out;
    }
    if (vm.count("config")) {
      std::vector<std::string> files = vm["config"].as<std::vector<std::string>>();
      // Later files win: store them last to first, since store keeps the first value.
      for (auto it = files.rbegin(); it != files.rend(); ++it) {
        std::ifstream in(*it);
        if (!in) fail("cannot read config file '", *it, "'");
        try {
          po::store(po::parse_config_file(in, all, /*allow_unregistered=*/false), vm);
        } catch (const po::error& e) {
          try {
            rethrow_as_error(e);
          } catch (const Error& inner) {
            fail("config file '", *it, "': ", inner.what());
          }
        }
      }
    }
    po::notify(vm);
  } catch (const po::error& e) {
    rethrow_as_error(e);
  }
  c.train.activation_checkpointing = checkpoint_policy_from_name(checkpointing);
  table.resolve();
  c.validate();
  return out;
}

std::string train_options_help() {
  TrainConfig defaults;
  OptionTable table(defaults);
  po::options_description all("frugal train options");
  std::string checkpointing = "none";
  describe(all, table, defaults, checkpointing);
  std::ostringstream out;
  out << "usage: frugal train [CONFIG.cfg ...] [--section.key=value ...]\n\n"
         "Trains a Llama-family model. Keys come from .cfg files (INI sections such as\n"
         "[train] with `lr = 3e-3`), overridden by --section.key=value on the command line.\n"
         "Launch several ranks with mpirun -np N.\n\n"
      << all;
  return out.str();
}

}  // namespace frugal
