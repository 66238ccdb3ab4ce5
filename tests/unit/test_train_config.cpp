// The training configuration: the modes' names, the key table (parsing, single-key rules, the
// defaults that resolved, --help and doc/usage.md show), cross-key rules, and memory sizes with
// units (parallel.gpu_mem_limit).
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "catch_compat.h"
#include "config/config_keys.h"
#include "config/train_config.h"
#include "core/log.h"
#include "test_support.h"
#ifdef FRUGAL_HAVE_CLI
#include "app/options.h"
#endif

using namespace frugal;

namespace {

// The key of that name in `c`'s table.
ConfigKey key_of(TrainConfig& c, const std::string& name) {
  for (const ConfigKey& key : config_keys(c))
    if (key.name == name) return key;
  FAIL("no key " << name);
  return {};
}

// Every key with the text of its default, as frugal wrote them before the key table existed
// (checkpoints and train_config.json hold these; a resumed run must see the same ones).
const std::map<std::string, std::string> kDefaults = {
    {"model.hidden_size", "256"},
    {"model.intermediate_size", "688"},
    {"model.num_hidden_layers", "4"},
    {"model.num_attention_heads", "4"},
    {"model.num_key_value_heads", "4"},
    {"model.vocab_size", "2048"},
    {"model.head_dim", "0"},
    {"model.max_position_embeddings", "2048"},
    {"model.rope_theta", "10000"},
    {"model.rope_scaling", "none"},
    {"model.rope_scaling_factor", "1"},
    {"model.rope_original_max_position_embeddings", "0"},
    {"model.rope_low_freq_factor", "1"},
    {"model.rope_high_freq_factor", "4"},
    {"model.rope_beta_fast", "32"},
    {"model.rope_beta_slow", "1"},
    {"model.rope_attention_factor", "0"},
    {"model.rms_norm_eps", "1e-05"},
    {"model.tie_word_embeddings", "false"},
    {"model.sliding_window", "0"},
    {"model.hf_path", ""},
    {"data.dir", "data/fortunes"},
    {"data.train_on", "auto"},
    {"data.packing", "auto"},
    {"data.long_documents", "split"},
    {"train.steps", "300"},
    {"train.seed", "1234"},
    {"train.out_dir", "out/tiny"},
    {"train.lr", "0.003"},
    {"train.warmup_steps", "30"},
    {"train.min_lr_ratio", "0.1"},
    {"train.micro_batch_size", "8"},
    {"train.grad_accum_steps", "1"},
    {"train.seq_len", "128"},
    {"train.eval_every", "50"},
    {"train.eval_batches", "16"},
    {"train.init_std", "0.02"},
    {"train.type", "full"},
    {"train.activation_checkpointing", "none"},
    {"train.activation_offload", "none"},
    {"train.mlp_chunk_tokens", "0"},
    {"train.loss_chunk_tokens", "1024"},
    {"train.resume", "false"},
    {"train.sample_tokens", "48"},
    {"train.sample_prompt", "The "},
    {"lora.rank", "16"},
    {"lora.alpha", "32"},
    {"lora.dropout", "0"},
    {"lora.targets", "all"},
    {"optim.beta1", "0.9"},
    {"optim.beta2", "0.95"},
    {"optim.eps", "1e-08"},
    {"optim.weight_decay", "0.1"},
    {"optim.grad_clip", "1"},
    {"optim.state_dtype", "fp32"},
    {"optim.master_dtype", "auto"},
    {"optim.bf16_rounding", "stochastic"},
    {"optim.update", "step"},
    {"optim.per_layer_clip", "unit"},
    {"optim.type", "adamw"},
    {"galore.rank", "128"},
    {"galore.update_proj_gap", "200"},
    {"galore.scale", "0.25"},
    {"galore.projector", "randomized"},
    {"galore.oversampling", "8"},
    {"galore.power_iterations", "1"},
    {"galore.moments_on_refresh", "keep"},
    {"galore.stagger", "true"},
    {"galore.refresh", "pipelined"},
    {"galore.precision", "bf16"},
    {"galore.profile", "false"},
    {"parallel.offload", "none"},
    {"parallel.cp", "1"},
    {"parallel.dp_shard", "0"},
    {"parallel.node_ranks", "0"},
    {"parallel.replica_galore_projection", "true"},
    {"parallel.timeout_s", "300"},
    {"parallel.device", "auto"},
    {"parallel.gpu_mem_limit", "0"},
    {"ckpt.every", "0"},
    {"ckpt.keep", "2"},
    {"ckpt.final", "true"},
    {"ckpt.async", "true"},
    {"fp8.enabled", "false"},
    {"fp8.recipe", "delayed"},
    {"fp8.amax_history_len", "16"},
    {"fp8.margin", "0"},
    {"fp8.linears", "all"},
    {"fp8.gather_weights", "true"},
    {"monitor.log_every", "10"},
    {"monitor.health", "true"},
    {"monitor.on_divergence", "warn"},
    {"monitor.spike_window", "50"},
    {"monitor.spike_z", "6"},
    {"monitor.max_skipped_steps", "5"},
    {"monitor.max_rollbacks", "3"},
    {"monitor.rollback_lr_factor", "0.5"},
    {"monitor.rollback_lr_steps", "100"},
    {"monitor.slow_rank_factor", "1.5"},
    {"monitor.check_recompute_every", "100"},
    {"monitor.check_replicas_every", "100"},
    {"monitor.tensorboard", ""},
};

template <class E>
void check_round_trip() {
  for (const EnumName<E>& n : enum_names(E{})) {
    INFO(n.name);
    CHECK(enum_name(n.value) == n.name);
    CHECK(enum_from_name<E>(n.name) == n.value);
  }
}

}  // namespace

TEST_CASE("each mode's names round-trip, spelled as in the .cfg files", "[config]") {
  check_round_trip<TrainType>();
  check_round_trip<Offload>();
  check_round_trip<StateDType>();
  check_round_trip<MasterDType>();
  check_round_trip<Bf16Rounding>();
  check_round_trip<DivergenceAction>();
  check_round_trip<DeviceChoice>();
  check_round_trip<CheckpointPolicy>();
  check_round_trip<OptimizerType>();
  check_round_trip<GaloreProjectorKind>();
  check_round_trip<MomentsOnRefresh>();
  check_round_trip<UpdateTiming>();
  check_round_trip<PerLayerClip>();
  CHECK(enum_name_list<UpdateTiming>() == "step, per_layer");
  CHECK(enum_name_list<PerLayerClip>() == "none, unit, previous_norm");
  CHECK(enum_name_list<OptimizerType>() == "adamw, galore_adamw");
  CHECK(enum_name_list<GaloreProjectorKind>() == "svd, randomized");
  CHECK(enum_name_list<MomentsOnRefresh>() == "keep, project, reset");
  CHECK(enum_name_list<TrainType>() == "full, lora, qlora, hqq_lora");
  CHECK(enum_name_list<Offload>() == "none, optimizer, params");
  CHECK(enum_name_list<StateDType>() == "fp32, bf16, int8");
  CHECK(enum_name_list<MasterDType>() == "auto, fp32, bf16");
  CHECK(enum_name_list<Bf16Rounding>() == "stochastic, nearest");
  CHECK(enum_name_list<DeviceChoice>() == "auto, cpu, cuda");
  CHECK(enum_name_list<CheckpointPolicy>() == "none, selective, full");
  CHECK(enum_name(DeviceChoice::automatic) == "auto");
  CHECK(enum_name(TrainType::hqq_lora) == "hqq_lora");
  CHECK(enum_from_name<Offload>("params") == Offload::params);
  CHECK_FALSE(enum_from_name<Offload>("Params").has_value());
  CHECK_FALSE(enum_from_name<TrainType>("").has_value());
}

TEST_CASE("an unknown mode is refused naming the key and the allowed values", "[config]") {
  TrainConfig c;
  CHECK(test::error_of([&] { key_of(c, "train.type").set("qqlora"); }) ==
        "config key 'train.type': value 'qqlora' is not one of full, lora, qlora, hqq_lora");
  CHECK(test::error_of([&] { key_of(c, "parallel.offload").set("disk"); }) ==
        "config key 'parallel.offload': value 'disk' is not one of none, optimizer, params");
  CHECK(test::error_of([&] { key_of(c, "optim.state_dtype").set("fp16"); }) ==
        "config key 'optim.state_dtype': value 'fp16' is not one of fp32, bf16, int8");
  CHECK(test::error_of([&] { key_of(c, "parallel.device").set("gpu"); }) ==
        "config key 'parallel.device': value 'gpu' is not one of auto, cpu, cuda");
  CHECK(test::error_of([&] { key_of(c, "train.activation_checkpointing").set("some"); }) ==
        "config key 'train.activation_checkpointing': value 'some' is not one of none, "
        "selective, full");
  key_of(c, "train.type").set("hqq_lora");
  key_of(c, "parallel.offload").set("params");
  key_of(c, "parallel.device").set("auto");
  CHECK(c.train.type == TrainType::hqq_lora);
  CHECK(c.parallel.offload == Offload::params);
  CHECK(c.parallel.device == DeviceChoice::automatic);
}

TEST_CASE("values that are not of the key's type are refused naming the key", "[config]") {
  TrainConfig c;
  CHECK(test::error_of([&] { key_of(c, "train.lr").set("abc"); }) ==
        "config key 'train.lr': value 'abc' is not a number");
  CHECK(test::error_of([&] { key_of(c, "train.steps").set("1.5"); }) ==
        "config key 'train.steps': value '1.5' is not an integer");
  CHECK(test::error_of([&] { key_of(c, "train.seed").set("-1"); }) ==
        "config key 'train.seed': value '-1' is not a non-negative integer");
  CHECK(test::error_of([&] { key_of(c, "train.resume").set("maybe"); }) ==
        "config key 'train.resume': value 'maybe' is not true or false");
  CHECK(
      test::contains(test::error_of([&] { key_of(c, "train.steps").set("99999999999999999999"); }),
                     "'train.steps': value '99999999999999999999' is out of range"));
  key_of(c, "train.lr").set("3e-4");
  key_of(c, "train.resume").set("yes");
  key_of(c, "ckpt.final").set("False");
  key_of(c, "train.seed").set("18446744073709551615");
  CHECK(c.train.lr == 3e-4);
  CHECK(c.train.resume);
  CHECK_FALSE(c.ckpt.final);
  CHECK(c.train.seed == 18446744073709551615ull);
}

TEST_CASE("a value outside its key's range is refused naming the key and the range", "[config]") {
  TrainConfig c;
  CHECK(test::error_of([&] { c.validate(); }).empty());
  auto error_with = [](auto change) {
    TrainConfig changed;
    change(changed);
    return test::error_of([&] { changed.validate(); });
  };
  CHECK(error_with([](TrainConfig& c) { c.train.lr = 0; }) ==
        "config key 'train.lr': value 0 must be > 0");
  CHECK(error_with([](TrainConfig& c) { c.train.steps = 0; }) ==
        "config key 'train.steps': value 0 must be positive");
  CHECK(error_with([](TrainConfig& c) { c.train.eval_every = -1; }) ==
        "config key 'train.eval_every': value -1 must be >= 0");
  CHECK(error_with([](TrainConfig& c) { c.parallel.cp = 0; }) ==
        "config key 'parallel.cp': value 0 must be >= 1");
  CHECK(error_with([](TrainConfig& c) { c.optim.beta2 = 1; }) ==
        "config key 'optim.beta2': value 1 must lie in [0, 1)");
  CHECK(error_with([](TrainConfig& c) { c.train.min_lr_ratio = 1.5; }) ==
        "config key 'train.min_lr_ratio': value 1.5 must lie in [0, 1]");
  CHECK(error_with([](TrainConfig& c) { c.parallel.timeout_s = -0.5; }) ==
        "config key 'parallel.timeout_s': value -0.5 must be > 0");
  // [lora] counts only for a LoRA run.
  CHECK(error_with([](TrainConfig& c) { c.lora.dropout = 1; }).empty());
  CHECK(error_with([](TrainConfig& c) {
          c.lora.dropout = 1;
          c.train.type = TrainType::lora;
        }) == "config key 'lora.dropout': value 1 must lie in [0, 1)");
  CHECK(test::contains(error_with([](TrainConfig& c) {
                         c.lora.targets = "q_proj,attn";
                         c.train.type = TrainType::qlora;
                       }),
                       "config key 'lora.targets': 'attn' is not one of"));
  // [fp8] counts only with fp8.enabled; its projections' names are lora.targets' names.
  CHECK(error_with([](TrainConfig& c) { c.fp8.linears = "attn"; }).empty());
  CHECK(test::contains(error_with([](TrainConfig& c) {
                         c.fp8.enabled = true;
                         c.fp8.linears = "q_proj,attn";
                       }),
                       "config key 'fp8.linears': 'attn' is not one of"));
  CHECK(error_with([](TrainConfig& c) {
          c.fp8.enabled = true;
          c.fp8.amax_history_len = 0;
        }) == "config key 'fp8.amax_history_len': value 0 must be positive");
  CHECK(error_with([](TrainConfig& c) {
          c.fp8.enabled = true;
          c.fp8.margin = -1;
        }) == "config key 'fp8.margin': value -1 must be >= 0");
}

TEST_CASE("every key: declared once, in resolved with its default as before", "[config]") {
  TrainConfig c;
  std::set<std::string> names;
  for (const ConfigKey& key : config_keys(c)) {
    INFO(key.name);
    CHECK(names.insert(key.name).second);
    CHECK(kDefaults.count(key.name) == 1);
    CHECK_FALSE(key.doc.empty());
    CHECK_FALSE(key.allowed().empty());
  }
  CHECK(names.size() == kDefaults.size());
  c.resolve();
  CHECK(c.resolved == kDefaults);
  CHECK(c.resolved.at("train.lr") == "0.003");
  CHECK(c.resolved.at("parallel.offload") == "none");
  CHECK(c.resolved.at("train.activation_checkpointing") == "none");
}

TEST_CASE("doc/usage.md's rows come from the table", "[config]") {
  const std::string table = config_keys_markdown();
  CHECK(table.rfind("| key | default | allowed | meaning |\n|---|---|---|---|\n", 0) == 0);
  CHECK(test::contains(table, "\n| `train.lr` | 0.003 | > 0 | peak learning rate |\n"));
  CHECK(test::contains(table, "\n| `parallel.offload` | none | none, optimizer, params | "));
  CHECK(test::contains(table, "\n| `model.hf_path` | (empty) | a path | "));
  CHECK(test::contains(table, "\n| `train.sample_prompt` | \"The \" | any text | "));
  CHECK(test::contains(table, "\n| `optim.beta1` | 0.9 | [0, 1) | AdamW beta1 |\n"));
  size_t rows = 0;
  for (char ch : table) rows += ch == '\n';
  CHECK(rows == kDefaults.size() + 2);
}

TEST_CASE("parallel.gpu_mem_limit is checked as a size, naming the key", "[config]") {
  TrainConfig c;
  c.parallel.device = DeviceChoice::cuda;
  c.parallel.gpu_mem_limit = "24 pages";
  CHECK(
      test::contains(test::error_of([&] { c.validate(); }), "config key 'parallel.gpu_mem_limit'"));
  c.parallel.gpu_mem_limit = "24GiB";
  CHECK(test::error_of([&] { c.validate(); }).empty());
}

TEST_CASE("GaLore's keys: checked only with galore_adamw, a rank above a matrix's side allowed",
          "[config]") {
  TrainConfig c;
  c.model.hidden_size = 64;
  c.model.intermediate_size = 96;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 1;  // k_proj, v_proj [16, 64]: the smallest side is 16
  c.galore.rank = 0;                // AdamW ignores [galore]
  CHECK(test::error_of([&] { c.validate(); }).empty());
  c.optim.type = OptimizerType::galore_adamw;
  CHECK(test::contains(test::error_of([&] { c.validate(); }),
                       "config key 'galore.rank': value 0 must be positive"));
  // Above the smallest side (16): that matrix's subspace is all of it, as in galore-torch.
  c.galore.rank = 17;
  CHECK(test::error_of([&] { c.validate(); }).empty());
  // reset's bias correction counts from the refresh step, which a pipelined refresh moves.
  c.galore.moments_on_refresh = MomentsOnRefresh::reset;
  c.galore.refresh = GaloreRefresh::pipelined;
  CHECK(test::contains(test::error_of([&] { c.validate(); }),
                       "config key 'galore.moments_on_refresh': reset needs galore.refresh = "
                       "inline"));
  c.galore.refresh = GaloreRefresh::immediate;
  CHECK(test::error_of([&] { c.validate(); }).empty());
  // Each power iteration is a host stage more per refresh: a huge count never ends a refresh.
  c.galore.power_iterations = 17;
  CHECK(test::error_of([&] { c.validate(); }) ==
        "config key 'galore.power_iterations': value 17 must lie in [0, 16]");
  c.galore.power_iterations = 1;
  c.train.type = TrainType::qlora;
  CHECK(test::contains(test::error_of([&] { c.validate(); }),
                       "config key 'optim.type': galore_adamw trains full weights"));
}

TEST_CASE("the keys a run ignores, and why", "[config]") {
  TrainConfig c;  // full weights, AdamW, no FP8
  CHECK(c.unused_because("galore.rank") == "optim.type is adamw");
  CHECK(c.unused_because("lora.rank") == "train.type is full");
  CHECK(c.unused_because("fp8.recipe") == "fp8.enabled is false");
  CHECK(c.unused_because("fp8.enabled").empty());
  CHECK(c.unused_because("train.lr").empty());
  c.optim.type = OptimizerType::galore_adamw;
  c.fp8.enabled = true;
  CHECK(c.unused_because("galore.rank").empty());
  CHECK(c.unused_because("fp8.recipe").empty());
  c.train.type = TrainType::qlora;
  CHECK(c.unused_because("lora.rank").empty());
}

TEST_CASE("bf16 master weights: on either device, without offload, named combinations",
          "[config]") {
  TrainConfig c;
  c.optim.state_dtype = StateDType::bf16;
  CHECK(c.optim.bf16_master());  // auto follows the state
  c.parallel.device = DeviceChoice::cpu;
  CHECK(test::error_of([&] { c.validate(); }).empty());
  c.parallel.device = DeviceChoice::cuda;
  CHECK(test::error_of([&] { c.validate(); }).empty());
  c.parallel.offload = Offload::optimizer;
  CHECK(test::error_of([&] { c.validate(); }) ==
        "config key 'optim.state_dtype': bf16 works without offload (parallel.offload = "
        "optimizer): offload keeps the fp32 state on the host instead");
  c.optim.state_dtype = StateDType::fp32;
  CHECK_FALSE(c.optim.bf16_master());
  CHECK(test::error_of([&] { c.validate(); }).empty());
  c.optim.master_dtype = MasterDType::bf16;  // bf16 masters with fp32 moments
  CHECK(c.optim.bf16_master());
  CHECK(test::error_of([&] { c.validate(); }) ==
        "config key 'optim.master_dtype': bf16 works without offload (parallel.offload = "
        "optimizer): offload keeps fp32 master weights on the host instead");
  c.parallel.offload = Offload::none;
  CHECK(test::error_of([&] { c.validate(); }).empty());
  c.optim.master_dtype = MasterDType::fp32;
  c.optim.state_dtype = StateDType::bf16;
  CHECK_FALSE(c.optim.bf16_master());
  CHECK(
      test::contains(test::error_of([&] { c.validate(); }),
                     "'optim.master_dtype': fp32 with optim.state_dtype = bf16 is not supported"));
  // The rounding is a setting of bf16 masters only.
  c.optim.state_dtype = StateDType::fp32;
  CHECK(c.unused_because("optim.bf16_rounding") == "the master weights are fp32");
  c.optim.master_dtype = MasterDType::bf16;
  CHECK(c.unused_because("optim.bf16_rounding").empty());
}

TEST_CASE("optim.update = per_layer refuses what it cannot follow, by name", "[config]") {
  TrainConfig c;
  CHECK(c.unused_because("optim.per_layer_clip") == "optim.update is step");
  c.optim.update = UpdateTiming::per_layer;
  CHECK(c.unused_because("optim.per_layer_clip").empty());
  CHECK(test::error_of([&] { c.validate(); }).empty());
  c.parallel.offload = Offload::optimizer;
  CHECK(test::contains(test::error_of([&] { c.validate(); }),
                       "config key 'optim.update': per_layer works without offload "
                       "(parallel.offload = optimizer)"));
  c.parallel.offload = Offload::none;
  c.monitor.on_divergence = DivergenceAction::skip_batch;
  CHECK(test::contains(test::error_of([&] { c.validate(); }),
                       "config key 'monitor.on_divergence': skip_batch cannot undo per-layer "
                       "updates"));
  c.monitor.on_divergence = DivergenceAction::warn;
  c.optim.type = OptimizerType::galore_adamw;
  c.galore.refresh = GaloreRefresh::pipelined;
  CHECK(test::contains(test::error_of([&] { c.validate(); }),
                       "config key 'galore.refresh': pipelined"));
  c.galore.refresh = GaloreRefresh::immediate;
  CHECK(test::error_of([&] { c.validate(); }).empty());
  // The ordinary step takes all of them.
  c.optim.update = UpdateTiming::step;
  c.galore.refresh = GaloreRefresh::pipelined;
  c.parallel.offload = Offload::optimizer;
  c.monitor.on_divergence = DivergenceAction::skip_batch;
  CHECK(test::error_of([&] { c.validate(); }).empty());
}

#ifdef FRUGAL_HAVE_CLI
TEST_CASE("frugal train's command line: modes, defaults and --help from the table", "[config]") {
  const TrainOptions defaults = parse_train_options({});
  CHECK(defaults.config.resolved == kDefaults);

  const TrainOptions o = parse_train_options({"--train.type", "qlora", "--parallel.offload=params",
                                              "--train.activation_checkpointing=selective",
                                              "--train.lr=1e-4", "--parallel.offload=optimizer"});
  CHECK(o.config.train.type == TrainType::qlora);
  CHECK(o.config.parallel.offload == Offload::optimizer);  // the last one wins
  CHECK(o.config.train.activation_checkpointing == CheckpointPolicy::selective);
  CHECK(o.config.resolved.at("train.type") == "qlora");
  CHECK(o.config.resolved.at("parallel.offload") == "optimizer");
  CHECK(o.config.resolved.at("train.lr") == "1e-04");

  CHECK(test::error_of([] { parse_train_options({"--train.type=x"}); }) ==
        "config key 'train.type': value 'x' is not one of full, lora, qlora, hqq_lora");
  CHECK(test::error_of([] { parse_train_options({"--train.lr=0"}); }) ==
        "config key 'train.lr': value 0 must be > 0");
  CHECK(test::contains(test::error_of([] { parse_train_options({"--train.bogus=1"}); }),
                       "unknown config key 'train.bogus'"));

  const std::string help = train_options_help();
  for (const auto& [name, value] : kDefaults) {
    INFO(name);
    // Boost prints no "(=)" for an empty default.
    CHECK(test::contains(help, "--" + name + " arg" + (value.empty() ? " " : " (=" + value + ")")));
  }
  // Boost wraps the descriptions: read them with the line breaks and indents as one space.
  std::string flowing;
  for (char ch : help)
    if (!std::isspace(static_cast<unsigned char>(ch)) ||
        (!flowing.empty() && flowing.back() != ' '))
      flowing += std::isspace(static_cast<unsigned char>(ch)) ? ' ' : ch;
  CHECK(test::contains(flowing, "(allowed: full, lora, qlora, hqq_lora)"));
  CHECK(test::contains(flowing, "peak learning rate (allowed: > 0)"));
  CHECK(parse_train_options({"--help-keys-markdown"}).help_keys_markdown);
}

TEST_CASE("a .cfg file's bad value names the file and the key", "[config]") {
  test::TempDir dir;
  const std::string cfg = dir.file("bad.cfg");
  std::ofstream(cfg) << "[parallel]\noffload = disk\n";
  const std::string message = test::error_of([&] { parse_train_options({cfg}); });
  CHECK(message == "config file '" + cfg +
                       "': config key 'parallel.offload': value 'disk' is not one of none, "
                       "optimizer, params");
  std::ofstream(cfg) << "[parallel]\noffload = params\n[train]\ntype = lora\n";
  const TrainOptions o = parse_train_options({cfg, "--train.type=full"});
  CHECK(o.config.parallel.offload == Offload::params);
  CHECK(o.config.train.type == TrainType::full);  // the command line wins over the file
}

// Boost's messages replaced placeholders until none was left: text holding one looped forever
// (fuzzing found the .cfg lines; every subcommand's command line had it too).
TEST_CASE("text that names a Boost placeholder gets a message, not a hang", "[config]") {
  test::TempDir dir;
  const std::string cfg = dir.file("placeholder.cfg");
  std::ofstream(cfg) << "[model]\n%invalid_line%\n";
  const std::string percent = "\xef\xbc\x85";  // U+FF05, how a '%' of the input is shown
  CHECK(test::error_of([&] { parse_train_options({cfg}); }) ==
        "config file '" + cfg + "': the options configuration file contains an invalid line '" +
            percent + "invalid_line" + percent + "'");
  CHECK(test::contains(test::error_of([] { parse_train_options({"--%canonical_option%"}); }),
                       "unknown config key '%canonical_option%'"));
  std::ofstream(cfg) << "[model]\n%option%%original_token%=%value%\n";
  CHECK(test::contains(test::error_of([&] { parse_train_options({cfg}); }),
                       "unknown config key 'model.%option%%original_token%'"));
}

TEST_CASE("every shipped configs/*.cfg parses and validates", "[config]") {
  for (const auto& entry : std::filesystem::directory_iterator(FRUGAL_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".cfg") continue;
    INFO(entry.path());
    CHECK(test::error_of([&] { parse_train_options({entry.path().string()}); }).empty());
  }
}
#endif

TEST_CASE("sizes with units parse to bytes", "[config]") {
  CHECK(parse_bytes("0", "k") == 0);
  CHECK(parse_bytes("1000000", "k") == 1000000);
  CHECK(parse_bytes("24GiB", "k") == size_t(24) << 30);
  CHECK(parse_bytes("24 gib", "k") == size_t(24) << 30);
  CHECK(parse_bytes("1.5GiB", "k") == size_t(3) << 29);
  CHECK(parse_bytes("512MiB", "k") == size_t(512) << 20);
  CHECK(parse_bytes("3KiB", "k") == 3072);
  CHECK(parse_bytes("2TiB", "k") == size_t(2) << 40);
  CHECK(parse_bytes("24GB", "k") == size_t(24000000000));
  CHECK(parse_bytes("7 MB", "k") == size_t(7000000));
  CHECK(parse_bytes("64B", "k") == 64);
}

TEST_CASE("a bad size names the key and the text", "[config]") {
  for (const char* text : {"lots", "24 GiBs", "-1GiB", "", "GiB", "1e30"}) {
    const std::string message =
        test::error_of([&] { parse_bytes(text, "parallel.gpu_mem_limit"); });
    INFO(text << " -> " << message);
    CHECK(test::contains(message, "parallel.gpu_mem_limit"));
    CHECK(test::contains(message, "is not a size"));
  }
}

TEST_CASE("a non-finite value of any floating-point key is refused naming the key", "[config]") {
  // from_chars reads "inf", "-inf" and "nan": they passed every bound check (inf is > 0), and
  // NaN failed a range's with the wrong complaint.
  TrainConfig defaults;
  size_t floating = 0;
  for (const ConfigKey& key : config_keys(defaults)) {
    if (!std::holds_alternative<double*>(key.field)) continue;
    ++floating;
    for (const char* text : {"inf", "-inf", "nan"}) {
      TrainConfig c;  // with the key's section in use ([lora], [galore], [fp8] may be ignored)
      if (key.section() == "lora") c.train.type = TrainType::lora;
      if (key.section() == "galore") c.optim.type = OptimizerType::galore_adamw;
      if (key.section() == "fp8") c.fp8.enabled = true;
      for (const ConfigKey& k : config_keys(c))
        if (k.name == key.name) k.set(text);
      INFO(key.name << " = " << text);
      const std::string message = test::error_of([&] { c.validate(); });
      CHECK(test::contains(message, "config key '" + key.name + "': value "));
      CHECK(test::contains(message, " is not a finite number"));
    }
  }
  CHECK(floating >= 10);  // lr, betas, eps, rope factors, lora.alpha, ...
  TrainConfig c;
  key_of(c, "train.lr").set("inf");
  CHECK(test::error_of([&] { c.validate(); }) ==
        "config key 'train.lr': value inf is not a finite number");
}
