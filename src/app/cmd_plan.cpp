// `frugal plan`: what a run would take on given machines (memory per rank, bytes per link
// class, the step-time bound) for every combination of techniques, and the cheapest that fits.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/regular_file.h"
#include "model/hf_model.h"
#include "plan/plan_search.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

const char* kPlanHelp =
    "usage: frugal plan MODEL_OR_CONFIG --gpus N --gpu-mem SIZE [options] [--section.key=value "
    "...]\n"
    "\n"
    "Predicts what a training run takes on each GPU (weights, gradients, optimizer state,\n"
    "activations, ZeRO-3's gathered units, the allocator's cache), the bytes a step moves over\n"
    "each link class and the step time, for every combination of techniques (checkpoint\n"
    "policy, fp32/bf16 state, GaLore, LoRA's base in bf16/NF4/HQQ, offload, flat or hybrid\n"
    "sharding), and recommends the fastest that fits. See doc/plan.md.\n"
    "\n"
    "MODEL_OR_CONFIG   .cfg files (as `frugal train` takes them), a Hugging Face model directory,\n"
    "                  or its config.json (the shape; other keys from the overrides)\n"
    "--gpus N          GPUs per node (one rank each)\n"
    "--nodes K         nodes (default 1)\n"
    "--gpu-mem SIZE    memory of each GPU, e.g. 24GiB\n"
    "--host-mem SIZE   host memory of each node, e.g. 128GiB (default: not checked)\n"
    "--link-intra BW   NCCL bus bandwidth between the GPUs of a node, e.g. 25GB/s (needed\n"
    "                  with 2 or more GPUs per node)\n"
    "--link-inter BW   bandwidth between nodes, per node, e.g. 2.5GB/s (needed with 2 or\n"
    "                  more nodes)\n"
    "--gpu-tflops X    a GPU's training throughput in TFLOP/s of model FLOPs (default: 444,\n"
    "                  measured on an H200, doc/benchmarks.md)\n"
    "--json            one JSON object instead of the table\n"
    "--section.key=value   any `frugal train` key (train.seq_len, train.micro_batch_size,\n"
    "                  train.type, lora.rank, galore.rank, parallel.cp, ...)\n";

struct PlanArgs {
  std::string model;
  Cluster cluster;
  bool json = false, help = false;
  std::vector<std::string> more_configs;  // .cfg files after the first
  std::vector<std::string> train_args;    // --section.key=value for parse_train_options
};

PlanArgs parse_plan_args(const std::vector<std::string>& args) {
  PlanArgs out;
  bool gpus = false, gpu_mem = false, intra = false, inter = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    const size_t eq = a.find('=');
    const bool own = a.rfind("--", 0) == 0 && a.find('.') == std::string::npos;
    if (own && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    auto take = [&]() -> std::string {
      if (eq != std::string::npos) return value;
      if (i + 1 >= args.size()) fail("option '", a, "' needs a value (see `frugal plan --help`)");
      return args[++i];
    };
    auto count = [&](const std::string& text) {
      size_t used = 0;
      long long n = 0;
      try {
        n = std::stoll(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != text.size() || n < 1)
        fail("option '", a, "': '", text, "' is not a positive whole number");
      if (n > 1000000) fail("option '", a, "': ", text, " is more than 1,000,000");
      return int64_t(n);
    };
    auto size = [&](const std::string& text) {
      size_t bytes = 0;
      try {
        bytes = parse_bytes(text, a);
      } catch (const Error&) {
        fail("option '", a, "': '", text, "' is not a size (e.g. 24GiB, 128GB)");
      }
      if (bytes == 0) fail("option '", a, "': a machine of 0 bytes (leave it out: not checked)");
      return bytes;
    };
    if (a == "--help" || a == "-h") {
      out.help = true;
    } else if (a == "--json") {
      out.json = true;
    } else if (a == "--gpus") {
      out.cluster.gpus_per_node = count(take());
      gpus = true;
    } else if (a == "--nodes") {
      out.cluster.nodes = count(take());
    } else if (a == "--gpu-mem") {
      out.cluster.gpu_mem_bytes = size(take());
      gpu_mem = true;
    } else if (a == "--host-mem") {
      out.cluster.host_mem_bytes = size(take());
    } else if (a == "--link-intra") {
      out.cluster.link_intra_bytes_per_s = parse_bandwidth(take(), a);
      intra = true;
    } else if (a == "--link-inter") {
      out.cluster.link_inter_bytes_per_s = parse_bandwidth(take(), a);
      inter = true;
    } else if (a == "--gpu-tflops") {
      const std::string text = take();
      size_t used = 0;
      double t = 0;
      try {
        t = std::stod(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != text.size() || !(t > 0) || t > 1e6)
        fail("option '--gpu-tflops': '", text, "' is not a positive number of TFLOP/s");
      out.cluster.gpu_flops = t * 1e12;
    } else if (own) {
      fail("unknown option '", a,
           "' (see `frugal plan --help`; config keys are --section.key=value)");
    } else if (a.rfind("--", 0) == 0) {
      out.train_args.push_back(args[i]);
      // "--section.key value"
      if (eq == std::string::npos && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0)
        out.train_args.push_back(args[++i]);
    } else if (out.model.empty()) {
      out.model = a;
    } else if (fs::path(out.model).extension() == ".cfg" && fs::path(a).extension() == ".cfg") {
      out.more_configs.push_back(a);  // more .cfg files: later ones win
    } else {
      fail("frugal plan takes one model or config, got '", out.model, "' and '", a, "'");
    }
  }
  if (out.help) return out;
  if (out.model.empty())
    fail("frugal plan needs a model: a .cfg file, a Hugging Face directory or its config.json");
  if (!gpus) fail("frugal plan needs --gpus N (GPUs per node)");
  if (!gpu_mem) fail("frugal plan needs --gpu-mem SIZE (each GPU's memory, e.g. 24GiB)");
  if (out.cluster.gpus_per_node > 1 && !intra)
    fail("with --gpus ", out.cluster.gpus_per_node,
         ", frugal plan needs --link-intra (e.g. 25GB/s)");
  if (out.cluster.nodes > 1 && !inter)
    fail("with --nodes ", out.cluster.nodes, ", frugal plan needs --link-inter (e.g. 2.5GB/s)");
  if (!inter) out.cluster.link_inter_bytes_per_s = out.cluster.link_intra_bytes_per_s;
  return out;
}

// The run: a .cfg file with the overrides, or a Hugging Face shape with the overrides.
TrainConfig plan_config(const PlanArgs& p) {
  std::error_code ec;
  const fs::path path(p.model);
  if (!fs::exists(path, ec)) fail("'", p.model, "' does not exist");
  std::vector<std::string> args = p.train_args;
  std::string hf_json;
  if (fs::is_directory(path, ec)) {
    hf_json = (path / "config.json").string();
    if (!fs::exists(hf_json, ec))
      fail("'", p.model, "' is a directory without config.json: not a Hugging Face model");
  } else if (path.filename() == "config.json" || path.extension() == ".json") {
    hf_json = p.model;
  } else {
    args.insert(args.begin(), p.more_configs.begin(), p.more_configs.end());
    args.insert(args.begin(), p.model);  // .cfg files, in order
  }
  if (!hf_json.empty()) args.push_back("--model.hf_path=" + p.model);  // the shape is config.json's
  TrainConfig c = parse_train_options(args).config;
  if (!hf_json.empty()) {
    nlohmann::json j;
    const std::string text = read_regular_file(hf_json, "Hugging Face config");
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail(hf_json, ": not valid JSON: ", e.what());
    }
    c.model = llama_config_from_hf_json(j, hf_json);
    c.model_hf_path.clear();
    c.validate_model_dependent();
  }
  if (c.parallel.cp > p.cluster.gpus_per_node || p.cluster.gpus_per_node % c.parallel.cp != 0)
    fail("config key 'parallel.cp': ", c.parallel.cp, " must divide the GPUs of a node (--gpus ",
         p.cluster.gpus_per_node, ")");
  return c;
}

double gib(size_t bytes) { return double(bytes) / 1073741824.0; }

nlohmann::json option_json(const PlanOption& o) {
  nlohmann::json parts;
  for (size_t k = 0; k < size_t(MemoryPart::count); ++k)
    parts[memory_part_name(MemoryPart(k))] = o.memory.parts[k];
  return {{"techniques",
           {{"train.type", std::string(enum_name(o.config.train.type))},
            {"optim.type", std::string(enum_name(o.config.optim.type))},
            {"optim.state_dtype", std::string(enum_name(o.config.optim.state_dtype))},
            {"optim.master_dtype", o.config.optim.bf16_master() ? "bf16" : "fp32"},
            {"train.activation_checkpointing",
             std::string(enum_name(o.config.train.activation_checkpointing))},
            {"parallel.offload", std::string(enum_name(o.config.parallel.offload))},
            {"mesh", o.mesh_kind == MeshKind::hybrid ? "hybrid" : "flat"},
            {"dp_shard", o.mesh.shard / o.mesh.cp},
            {"dp_replicate", o.mesh.replicas},
            {"cp", o.mesh.cp}}},
          {"gpu_bytes",
           {{"reserved", o.memory.device_reserved},
            {"in_use", o.memory.device_in_use},
            {"parts", parts}}},
          {"host_bytes_per_rank",
           {{"state", o.memory.host_state},
            {"checkpoint_staging", o.memory.host_staging},
            {"activation_inputs", o.memory.host_activations}}},
          {"host_bytes_per_node", o.host_per_node},
          {"bytes_per_step_per_rank",
           {{"intra_node", o.time.bytes.intra_node},
            {"inter_node", o.time.bytes.inter_node},
            {"host", o.time.bytes.host}}},
          {"step_seconds", o.time.step_s},
          {"compute_seconds", o.time.compute_s},
          {"communication_seconds", o.time.comm_s},
          {"tokens_per_step", o.time.tokens},
          {"tokens_per_second", o.time.tokens_per_s()},
          {"fits", o.fits()},
          {"verdict", o.verdict}};
}

void print_table(const TrainConfig& c, const Cluster& cl, const Plan& plan) {
  std::printf(
      "model: %lld layers, hidden %lld, %.2f B parameters; %lld x %lld tokens per GPU, %lld "
      "micro-batch(es) a step, cp %lld\n",
      (long long)c.model.num_hidden_layers, (long long)c.model.hidden_size,
      double(c.model.parameter_count()) / 1e9, (long long)c.train.micro_batch_size,
      (long long)c.train.seq_len, (long long)c.train.grad_accum_steps, (long long)c.parallel.cp);
  std::printf(
      "machines: %lld node(s) x %lld GPU(s) of %.1f GiB, host %s per node, links %.1f GB/s in a "
      "node, %.1f GB/s between nodes, %.0f TFLOP/s per GPU\n\n",
      (long long)cl.nodes, (long long)cl.gpus_per_node, gib(cl.gpu_mem_bytes),
      cl.host_mem_bytes ? (std::to_string(int(gib(cl.host_mem_bytes) + 0.5)) + " GiB").c_str()
                        : "unchecked",
      cl.link_intra_bytes_per_s / 1e9, cl.link_inter_bytes_per_s / 1e9, cl.gpu_flops / 1e12);
  std::printf("%-52s %9s %9s %9s %8s %9s %8s %8s  %s\n", "option", "GPU GiB", "reserved",
              "host/node", "step s", "tokens/s", "intra GB", "inter GB", "verdict");
  for (const PlanOption& o : plan.options)
    std::printf("%-52s %9.2f %9.2f %9.1f %8.3f %9.0f %8.2f %8.2f  %s\n", o.techniques().c_str(),
                gib(o.memory.device_in_use), gib(o.memory.device_reserved), gib(o.host_per_node),
                o.time.step_s, o.time.tokens_per_s(), o.time.bytes.intra_node / 1e9,
                o.time.bytes.inter_node / 1e9, o.verdict.c_str());
  if (!plan.found) {
    std::printf(
        "\nnothing fits: more GPUs or nodes, a shorter train.seq_len, a smaller micro-batch, or "
        "(for fine-tuning) train.type = qlora would lower it\n");
    return;
  }
  const PlanOption& pick = plan.options.front();
  std::printf("\nrecommended: %s\n  GPU memory per rank (reserved by the allocator):",
              pick.techniques().c_str());
  for (size_t k = 0; k < size_t(MemoryPart::count); ++k)
    if (pick.memory.parts[k])
      std::printf(" %s %.2f GiB;", memory_part_name(MemoryPart(k)), gib(pick.memory.parts[k]));
  std::printf(
      "\n  keys: --train.type=%s --optim.type=%s --optim.state_dtype=%s --optim.master_dtype=%s "
      "--train.activation_checkpointing=%s --parallel.offload=%s",
      std::string(enum_name(pick.config.train.type)).c_str(),
      std::string(enum_name(pick.config.optim.type)).c_str(),
      std::string(enum_name(pick.config.optim.state_dtype)).c_str(),
      pick.config.optim.bf16_master() ? "bf16" : "fp32",
      std::string(enum_name(pick.config.train.activation_checkpointing)).c_str(),
      std::string(enum_name(pick.config.parallel.offload)).c_str());
  if (pick.mesh_kind == MeshKind::hybrid)
    std::printf(" (hybrid sharding: dp_shard %lld x dp_replicate %lld)",
                (long long)(pick.mesh.shard / pick.mesh.cp), (long long)pick.mesh.replicas);
  std::printf("\n");
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  const PlanArgs p = parse_plan_args(args);
  if (p.help) {
    std::cout << kPlanHelp;
    return 0;
  }
  const TrainConfig config = plan_config(p);
  const Plan plan = make_plan(config, p.cluster);
  if (p.json) {
    nlohmann::json out = {{"found", plan.found}, {"parameters", config.model.parameter_count()}};
    out["options"] = nlohmann::json::array();
    for (const PlanOption& o : plan.options) out["options"].push_back(option_json(o));
    if (plan.found) out["picked"] = 0;
    std::cout << out.dump() << "\n";
  } else {
    print_table(config, p.cluster, plan);
  }
  return plan.found ? 0 : 3;
}

}  // namespace frugal
