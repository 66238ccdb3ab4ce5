// The options of a plan and the choice among them.
#include "plan/plan_search.h"

#include <algorithm>
#include <cstdio>

namespace frugal {

namespace {

std::string gib_text(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / 1073741824.0);
  return buf;
}

PlanOption evaluate(const TrainConfig& config, MeshKind kind, const Cluster& cluster) {
  PlanOption o;
  o.config = config;
  o.mesh_kind = kind;
  o.mesh = mesh_shape(cluster, kind, config.parallel.cp);
  o.memory = estimate_memory(config, o.mesh);
  o.time = estimate_step_time(config, o.mesh, cluster);
  o.host_per_node = o.memory.host() * size_t(cluster.gpus_per_node);
  // Under a cap the caching allocator gives its cache back before it fails: what is in use
  // must fit.
  o.fits_gpu = cluster.gpu_mem_bytes == 0 || o.memory.device_in_use <= cluster.gpu_mem_bytes;
  o.fits_host = cluster.host_mem_bytes == 0 || o.host_per_node <= cluster.host_mem_bytes;
  o.arithmetic_changes =
      config.optim.bf16_master() + (config.optim.state_dtype == StateDType::int8) +
      (config.optim.type == OptimizerType::galore_adamw) +
      (config.train.type == TrainType::qlora || config.train.type == TrainType::hqq_lora);
  if (!o.fits_gpu)
    o.verdict = "rejected: needs " + gib_text(o.memory.device_in_use) +
                " of GPU memory, the GPU has " + gib_text(cluster.gpu_mem_bytes);
  else if (!o.fits_host)
    o.verdict = "rejected: needs " + gib_text(o.host_per_node) +
                " of host memory per node, a node has " + gib_text(cluster.host_mem_bytes);
  return o;
}

}  // namespace

std::string PlanOption::techniques() const {
  std::string out(enum_name(config.train.type));
  out += ", ";
  out += config.optim.type == OptimizerType::galore_adamw ? "galore" : "adamw";
  out += " ";
  out += enum_name(config.optim.state_dtype);
  // optim.master_dtype is not searched over: the base configuration's, named where it is not
  // what the moments' dtype implies.
  if (config.optim.bf16_master() && config.optim.state_dtype != StateDType::bf16)
    out += " (bf16 masters)";
  out += ", ";
  out += enum_name(config.train.activation_checkpointing);
  out += ", offload ";
  out += enum_name(config.parallel.offload);
  // Not searched over: the base configuration's setting (the step-time model has no term for
  // its host-link traffic yet).
  if (config.train.activation_offload == ActivationOffload::inputs) out += ", activation offload";
  out += mesh_kind == MeshKind::hybrid ? ", hybrid" : ", flat";
  return out;
}

Plan make_plan(const TrainConfig& base, const Cluster& cluster) {
  std::vector<TrainType> types = {base.train.type};
  if (base.train.type != TrainType::full)
    types = {TrainType::lora, TrainType::qlora, TrainType::hqq_lora};
  std::vector<MeshKind> meshes = {MeshKind::flat};
  if (cluster.nodes > 1) meshes.push_back(MeshKind::hybrid);

  Plan plan;
  for (TrainType type : types)
    for (OptimizerType optimizer : {OptimizerType::adamw, OptimizerType::galore_adamw}) {
      if (optimizer == OptimizerType::galore_adamw && type != TrainType::full) continue;
      for (StateDType state : {StateDType::fp32, StateDType::bf16, StateDType::int8})
        for (Offload offload : {Offload::none, Offload::optimizer, Offload::params}) {
          // What the run refuses (TrainConfig::validate): bf16 moments or masters, or per-layer
          // updates, with offload; bf16 moments with fp32 masters.
          OptimConfig optim = base.optim;
          optim.state_dtype = state;
          if ((state == StateDType::bf16 || optim.bf16_master() ||
               optim.update == UpdateTiming::per_layer) &&
              offload != Offload::none)
            continue;
          if (optim.master_dtype == MasterDType::fp32 && state == StateDType::bf16) continue;
          for (CheckpointPolicy policy :
               {CheckpointPolicy::none, CheckpointPolicy::selective, CheckpointPolicy::full})
            for (MeshKind mesh : meshes) {
              TrainConfig c = base;
              c.train.type = type;
              c.optim.type = optimizer;
              c.optim.state_dtype = state;
              c.parallel.offload = offload;
              c.train.activation_checkpointing = policy;
              plan.options.push_back(evaluate(c, mesh, cluster));
            }
        }
    }

  std::vector<PlanOption>& o = plan.options;
  std::stable_sort(o.begin(), o.end(), [](const PlanOption& a, const PlanOption& b) {
    if (a.fits() != b.fits()) return a.fits();
    return a.time.step_s < b.time.step_s;
  });
  if (o.empty() || !o.front().fits()) return plan;
  // Within 1 % of the fastest, the least change to the arithmetic, then the least memory.
  const double fastest = o.front().time.step_s;
  auto close = [&](const PlanOption& p) { return p.fits() && p.time.step_s <= fastest * 1.01; };
  auto pick = o.begin();
  for (auto it = o.begin(); it != o.end() && close(*it); ++it)
    if (it->arithmetic_changes < pick->arithmetic_changes ||
        (it->arithmetic_changes == pick->arithmetic_changes &&
         it->memory.device_in_use < pick->memory.device_in_use))
      pick = it;
  std::rotate(o.begin(), pick, pick + 1);
  plan.found = true;
  const PlanOption& chosen = o.front();
  o.front().verdict =
      "picked: the fastest that fits" +
      std::string(chosen.arithmetic_changes > 0 ? "" : ", with the training's own arithmetic");
  for (size_t i = 1; i < o.size(); ++i) {
    PlanOption& p = o[i];
    if (!p.fits()) continue;
    char buf[160];
    const double ratio = p.time.step_s / chosen.time.step_s;
    if (ratio > 1.01)
      std::snprintf(buf, sizeof buf, "fits; %.2fx the pick's step time", ratio);
    else if (p.arithmetic_changes > chosen.arithmetic_changes)
      std::snprintf(buf, sizeof buf, "fits as fast; changes the arithmetic more (%s)",
                    p.config.optim.state_dtype == StateDType::bf16       ? "bf16 state"
                    : p.config.optim.state_dtype == StateDType::int8     ? "8-bit state"
                    : p.config.optim.type == OptimizerType::galore_adamw ? "GaLore"
                                                                         : "4-bit base");
    else
      std::snprintf(buf, sizeof buf, "fits as fast; needs more GPU memory");
    p.verdict = buf;
  }
  // GaLore with its state on the host runs its projections there (several TFLOP a step at a 7B
  // shape): the step time counts only what offload costs AdamW, so it says so.
  for (PlanOption& p : o)
    if (p.fits() && p.config.optim.type == OptimizerType::galore_adamw &&
        p.config.parallel.offload != Offload::none)
      p.verdict += "; its step time leaves out GaLore's projections on the host";
  return plan;
}

}  // namespace frugal
