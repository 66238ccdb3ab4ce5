// ZeRO-3 sharded parameters: gathers with prefetch, reduce-scatter of gradients.
#include "parallel/zero3_parameters.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/log.h"
#include "core/progress.h"
#include "parallel/hqq_encoding.h"
#include "parallel/nf4_encoding.h"

namespace frugal {

namespace {

// The encoding a parameter is kept in, or null (trainable ones never are).
std::unique_ptr<WeightEncoding> encoding_for(const ParamSpec& spec, const Zero3Init& init) {
  if (spec.trainable) return nullptr;
  if (init.nf4 && init.nf4(spec)) return std::make_unique<Nf4Encoding>();
  if (init.hqq && init.hqq(spec)) return std::make_unique<HqqEncoding>();
  return init.encoding ? init.encoding(spec) : nullptr;
}

// The slot a trainable weight is cast with to be gathered as FP8, or none. A GPU's cast takes
// rows and columns in multiples of 16 (cuBLASLt's FP8 layouts): a shard of other rows is
// gathered in bf16 (said once per weight).
std::optional<ops::Fp8Slot> fp8_gather_slot(const ParamSpec& spec, const ShardLayout& l,
                                            const Zero3Init& init, Device gathering) {
  if (!spec.trainable || !init.fp8_gather || spec.shape.size() != 2) return std::nullopt;
  std::optional<ops::Fp8Slot> slot = init.fp8_gather(spec);
  if (slot && gathering != Device::cpu && (l.shard_rows % 16 != 0 || l.row_len % 16 != 0)) {
    log_info("fp8: '", spec.name, "' is gathered in bf16: its shard of [", l.shard_rows, ", ",
             l.row_len, "] is not a multiple of 16 in both dimensions");
    return std::nullopt;
  }
  return slot;
}

}  // namespace

Zero3Parameters::Zero3Parameters(std::vector<UnitSpec> units, Comm& comm, const Zero3Arenas& arenas,
                                 uint64_t seed, float init_std, bool with_grads,
                                 const Zero3Init& init_from, const Zero3Replicas& replicas)
    : units_(std::move(units)),
      comm_(comm),
      arenas_(arenas),
      placement_(arenas),
      replicas_(replicas),
      replica_summed_(units_.size(), false) {
  const int rank = comm_.rank(), ranks = comm_.size();
  const EncodingContext encoding_context{comm_, *arenas_.gathered, placement_.encoded_store()};
  // A 70B model takes minutes to load and quantize: a progress line every 15 s.
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const bool quantized = init_from.nf4 || init_from.hqq || init_from.encoding;
  Progress progress(
      quantized ? "parameters: units initialised and quantized" : "parameters: units initialised",
      int64_t(units_.size()), [](int64_t n) { return std::to_string(n); }, 15);
  for (const UnitSpec& unit : units_) {
    std::vector<ShardLayout> layouts;
    std::vector<Tensor> shards, grads;
    std::vector<std::unique_ptr<WeightEncoding>> encoded;
    std::vector<std::optional<ops::Fp8Slot>> fp8_slots;
    for (const ParamSpec& spec : unit.params) {
      ShardLayout l = shard_layout(spec, ranks);
      std::unique_ptr<WeightEncoding> encoding = encoding_for(spec, init_from);
      // A weight that comes from the seed may be made and encoded on the GPU (a random 70B base
      // in seconds instead of minutes): the same parts as from the host's rows.
      const bool seeded = !init_from.load_rows && init_is_normal(spec.name);
      if (encoding && seeded &&
          encoding->encode_seeded(l, SeededRows{init_row_key(spec.name, seed), init_std},
                                  encoding_context)) {
        shards.push_back(Tensor());
      } else {
        // Initialised in host memory (the same numbers whatever the device), then moved.
        Tensor init = Tensor::zeros(l.shard_shape(), DType::f32);
        const int64_t first = l.first_row(rank), last = l.last_row(rank);
        if (last > first) {
          Tensor real_rows = init.rows(0, last - first);
          if (!init_from.load_rows || !init_from.load_rows(spec.name, first, last, real_rows))
            init_parameter_rows(real_rows, spec.name, first, seed, init_std);
        }
        // An encoded weight keeps its parts only: the fp32 rows go with `init`, one tensor's at
        // a time.
        if (encoding) {
          encoding->encode(l, init, encoding_context);
          shards.push_back(Tensor());
        } else {
          Tensor shard = Tensor::empty(l.shard_shape(), arenas_.master, *arenas_.params);
          ops::assign(shard, init);
          shards.push_back(shard);
        }
      }
      encoded.push_back(std::move(encoding));
      fp8_slots.push_back(fp8_gather_slot(spec, l, init_from, arenas_.gathered->device()));
      // A frozen parameter (LoRA's base) has no gradient shard and no optimizer state.
      if (with_grads)
        grads.push_back(spec.trainable ? ops::zeros(l.shard_shape(), arenas_.master, *arenas_.grads)
                                       : Tensor());
      layouts.push_back(l);
    }
    layouts_.push_back(std::move(layouts));
    shards_.push_back(std::move(shards));
    grad_shards_.push_back(std::move(grads));
    encoded_.push_back(std::move(encoded));
    fp8_slots_.push_back(std::move(fp8_slots));
    progress.advance(1);
  }
  grad_shards_handed_out_.assign(units_.size(), false);
  shards_uncleared_.assign(units_.size(), false);
  // The total, for a slow one (benchmarks read it: tools/bench/qlora_70b_one_gpu).
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();
  if (seconds >= 5)
    log_info("parameters: ", units_.size(), " units initialised", quantized ? " and quantized" : "",
             " in ", std::lround(seconds * 10) / 10.0, " s");
  refresh_copies();
  // On a GPU a frozen weight needs only its bf16 copy (or its host staging copy): its fp32
  // master would never change, so it goes (4 bytes per frozen weight).
  if (placement_.has_copies())
    for (size_t u = 0; u < units_.size(); ++u)
      for (size_t i = 0; i < units_[u].params.size(); ++i)
        if (!units_[u].params[i].trainable) shards_[u][i] = Tensor();
}

Zero3Parameters::~Zero3Parameters() = default;

void Zero3Parameters::refresh_copies() {
  updates_.wait_all();
  placement_.make_copies(shards_);
}

void Zero3Parameters::weights_updated() { placement_.weights_updated(units_); }

void Zero3Parameters::apply_update(size_t n_slices, std::function<void(size_t)> update_slice) {
  if (!placement_.host_state())
    return ParameterProvider::apply_update(n_slices, std::move(update_slice));
  // The slices of each unit, numbered as trainable() numbers them.
  std::vector<std::vector<size_t>> unit_slices(units_.size());
  size_t k = 0;
  for (size_t u = 0; u < units_.size(); ++u)
    for (const ParamSpec& p : units_[u].params)
      if (p.trainable) unit_slices[u].push_back(k++);
  FRUGAL_CHECK(k == n_slices, "apply_update of ", n_slices, " slices; this rank has ", k);
  // The copies go up when next gathered, which waits for the unit's update first.
  weights_updated();
  // The host's AdamW (OpenMP inside update_slice) on its own thread, in the order the next
  // forward gathers the units; the GPU's work (copies up, gathers) stays on this thread.
  updates_.start(units_.size(), [unit_slices = std::move(unit_slices),
                                 update = std::move(update_slice)](size_t u) {
    for (size_t slice : unit_slices[u]) update(slice);
  });
}

void Zero3Parameters::wait_for_updates() { updates_.wait_all(); }

// --- gathers -------------------------------------------------------------------------------

Zero3Parameters::Gathered& Zero3Parameters::post_gather(int64_t unit) {
  FRUGAL_CHECK(unit >= 0 && unit < int64_t(units_.size()), "unit ", unit);
  updates_.wait(unit);  // the copies it uploads must be the updated ones
  auto it = gathered_.find(unit);
  if (it != gathered_.end()) return it->second;
  Gathered& g = gathered_[unit];
  const size_t n = layouts_[unit].size();
  // What the gathers read, on the gathering device: the plain weights' shards or copies (which
  // the placement uploads first when they are in host memory), the encoded weights' parts
  // (likewise: offload = params keeps them in pinned host memory; the gathers follow the
  // uploads on the same stream).
  std::vector<Tensor> source(n);
  g.fp8.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (encoded_[unit][i]) continue;
    // Alone, an FP8 weight gathered before in this step is its kept codes (fp8_whole below).
    auto kept = step_fp8_codes_.find({unit, i});
    if (kept != step_fp8_codes_.end() && gathered_as_fp8(unit, i)) {
      source[i] = kept->second;
      g.fp8[i] = ops::Fp8Matrix{};
      continue;
    }
    source[i] = placement_.gather_source(unit, i, shards_[unit][i], g.uploads);
    // Weights gathered as FP8: this rank's rows cast to E4M3 first (the casts read the uploads).
    if (gathered_as_fp8(unit, i)) {
      source[i] = fp8_rows(unit, i, source[i], g);
      if (alone()) step_fp8_codes_[{unit, i}] = source[i];
    }
  }
  auto local_parts = [&](size_t i) {
    std::vector<Tensor> parts;
    for (const EncodedPart& part : encoded_[unit][i]->parts())
      parts.push_back(placement_.on_gathering_device(part.data, g.uploads));
    return parts;
  };
  // An encoded weight's parts are gathered (on one rank: taken as they are); the whole weight
  // in the compute dtype is decoded from them only when asked for (gather: at once;
  // gather_compressed: one weight at a time, by materialize).
  g.parts.resize(n);
  const auto fp8_whole = [&](size_t i, const Tensor& codes) {
    const ShardLayout& l = layouts_[unit][i];
    g.fp8[i] = ops::Fp8Matrix{codes.view({l.rows_padded, l.row_len}).rows(0, l.rows),
                              fp8_slots_[unit][i]->scale_inv, ops::Fp8Format::e4m3};
  };
  if (alone()) {
    g.full = source;
    for (size_t i = 0; i < n; ++i) {
      if (encoded_[unit][i]) g.parts[i] = local_parts(i);
      if (g.fp8[i]) {
        fp8_whole(i, source[i]);
        g.full[i] = Tensor();
      }
    }
    return g;
  }
  // One all-gather per parameter (per row-sharded part of an encoded one), posted together as
  // one group: each lands a contiguous full matrix, because a shard is a contiguous block of rows.
  CommGroup group(comm_);
  for (size_t i = 0; i < n; ++i) {
    if (encoded_[unit][i]) {
      const std::vector<EncodedPart> parts = encoded_[unit][i]->parts();
      std::vector<Tensor> whole = local_parts(i);  // replicated parts: already whole
      for (size_t k = 0; k < parts.size(); ++k) {
        if (parts[k].split != PartSplit::rows) continue;
        const Tensor mine = whole[k];
        whole[k] = Tensor::empty({mine.numel() * comm_.size()}, mine.dtype(), *arenas_.gathered);
        g.ops.push_back(comm_.all_gather(mine, whole[k]));
      }
      g.parts[i] = std::move(whole);
      g.full.push_back(Tensor());
      continue;
    }
    if (g.fp8[i]) {  // the codes, one byte per weight
      Tensor whole = Tensor::empty({layouts_[unit][i].rows_padded * layouts_[unit][i].row_len},
                                   DType::u8, *arenas_.gathered);
      g.ops.push_back(comm_.all_gather(source[i], whole));
      fp8_whole(i, whole);
      g.full.push_back(Tensor());
      continue;
    }
    g.full.push_back(
        Tensor::empty(layouts_[unit][i].padded_shape(), source[i].dtype(), *arenas_.gathered));
    g.ops.push_back(comm_.all_gather(source[i], g.full.back()));
  }
  group.end();
  return g;
}

Tensor Zero3Parameters::fp8_rows(int64_t unit, size_t i, const Tensor& source, Gathered& g) {
  for (ops::SideCopy& upload : g.uploads) upload.wait();
  const ShardLayout& l = layouts_[unit][i];
  // The CPU casts f32 (a bf16 master shard is widened; exact); a GPU casts the bf16 copy.
  const DType compute = ops::compute_dtype(source.device());
  const Tensor rows =
      source.dtype() == compute ? source : ops::convert(source, compute, *arenas_.gathered);
  // Marks the weight as gathered in FP8 (fp8_whole fills it in); the padding rows are zeros,
  // code 0.
  g.fp8[i] = ops::Fp8Matrix{};
  return ops::fp8_cast(rows.view({l.shard_rows, l.row_len}), *fp8_slots_[unit][i], true, false)
      .plain.codes.view({l.shard_rows * l.row_len});
}

std::vector<Tensor> Zero3Parameters::unpadded(int64_t unit, const std::vector<Tensor>& full) const {
  std::vector<Tensor> out;
  for (size_t i = 0; i < full.size(); ++i) {
    const ShardLayout& l = layouts_[unit][i];
    out.push_back(full[i].defined() ? full[i].rows(0, l.rows).view(l.shape) : Tensor());
  }
  return out;
}

void Zero3Parameters::prefetch(int64_t unit) {
  if (unit >= 0 && unit < int64_t(units_.size())) post_gather(unit);
}

Zero3Parameters::Gathered& Zero3Parameters::wait_gathered(int64_t unit) {
  Gathered& g = post_gather(unit);
  for (ops::SideCopy& upload : g.uploads) upload.wait();
  for (Pending& op : g.ops) op->wait();
  g.ops.clear();
  // bf16 masters on the CPU (optim.master_dtype = bf16): gathered in bf16 (half the traffic),
  // widened once on arrival, exactly, for the layers' fp32 arithmetic. (On a GPU the gathered
  // weights are bf16 copies already.)
  const DType compute = ops::compute_dtype(arenas_.gathered->device());
  for (Tensor& full : g.full)
    if (full.defined() && full.dtype() == DType::bf16 && compute == DType::f32)
      full = ops::convert(full, compute, *arenas_.gathered);
  ++g.users;
  return g;
}

Tensor Zero3Parameters::decode(int64_t unit, size_t i, const Gathered& g) const {
  const ShardLayout& l = layouts_[unit][i];
  Tensor full = Tensor::empty(l.padded_shape(), ops::compute_dtype(arenas_.gathered->device()),
                              *arenas_.gathered);
  Tensor real = full.rows(0, l.rows);
  if (g.fp8[i])  // gathered as FP8 (asked for whole: gather, materialize)
    ops::dequantize_fp8(real, g.fp8[i]->codes, g.fp8[i]->scale_inv, g.fp8[i]->format);
  else
    encoded_[unit][i]->decode(g.parts[i], real);
  return full;
}

std::vector<Tensor> Zero3Parameters::gather(int64_t unit) {
  Gathered& g = wait_gathered(unit);
  for (size_t i = 0; i < g.full.size(); ++i)
    if ((encoded_[unit][i] || g.fp8[i]) && !g.full[i].defined()) g.full[i] = decode(unit, i, g);
  return unpadded(unit, g.full);
}

std::optional<ops::Fp8Matrix> Zero3Parameters::fp8_weight(int64_t unit, size_t i,
                                                          const ops::Fp8Slot& slot,
                                                          bool transposed) {
  auto it = gathered_.find(unit);
  FRUGAL_CHECK(it != gathered_.end() && it->second.users > 0 && i < encoded_[unit].size(),
               "fp8 weight ", i, " of unit ", unit, ", which is not gathered");
  const Gathered& g = it->second;
  if (g.fp8[i]) return transposed ? ops::fp8_transposed(*g.fp8[i]) : *g.fp8[i];
  if (!encoded_[unit][i]) return std::nullopt;
  const ShardLayout& l = layouts_[unit][i];
  std::optional<ops::Fp8Cast> cast =
      encoded_[unit][i]->decode_fp8(g.parts[i], l.rows, l.row_len, slot, !transposed, transposed);
  if (!cast) return std::nullopt;
  return transposed ? cast->transposed : cast->plain;
}

void Zero3Parameters::set_fp8_gathers(bool on) {
  step_fp8_codes_.clear();
  if (on == fp8_gathers_) return;
  for (const auto& [unit, g] : gathered_)
    for (const std::optional<ops::Fp8Slot>& slot : fp8_slots_[size_t(unit)])
      FRUGAL_CHECK(!slot, "FP8 weight gathers switched ", on ? "on" : "off", " while unit ", unit,
                   " is gathered");
  fp8_gathers_ = on;
}

bool Zero3Parameters::has_fp8_gathers() const {
  for (const auto& unit : fp8_slots_)
    for (const std::optional<ops::Fp8Slot>& slot : unit)
      if (slot) return true;
  return false;
}

std::vector<Tensor> Zero3Parameters::gather_compressed(int64_t unit) {
  return unpadded(unit, wait_gathered(unit).full);
}

Tensor Zero3Parameters::materialize(int64_t unit, size_t i) {
  auto it = gathered_.find(unit);
  FRUGAL_CHECK(it != gathered_.end() && it->second.users > 0 && i < encoded_[unit].size() &&
                   (encoded_[unit][i] || it->second.fp8[i]),
               "materialize of parameter ", i, " of unit ", unit,
               ", which is not a gathered encoded weight");
  const ShardLayout& l = layouts_[unit][i];
  const Tensor full = it->second.full[i].defined() ? it->second.full[i]  // gather made it
                                                   : decode(unit, i, it->second);
  return full.rows(0, l.rows).view(l.shape);
}

void Zero3Parameters::release(int64_t unit) {
  auto it = gathered_.find(unit);
  FRUGAL_CHECK(it != gathered_.end() && it->second.users > 0, "release of unit ", unit,
               " that is not gathered");
  if (--it->second.users == 0) gathered_.erase(it);
}

// --- gradients -----------------------------------------------------------------------------

UnitGrads Zero3Parameters::grads(int64_t unit, GradSums sums) {
  FRUGAL_CHECK(!grad_shards_.at(unit).empty(), "gradients asked of inference-only parameters");
  if (direct_grads()) {  // accumulate straight into them
    const GradWrite write = first_write(unit, sums);
    return {unpadded(unit, grad_shards_[unit]), write};
  }
  if (sums == GradSums::kOnce && direct_bf16_grads()) {
    updates_.wait(unit);  // its gradient shards are about to be written
    grad_shards_handed_out_.at(size_t(unit)) = true;
    const GradWrite write = first_write(unit, sums);
    return {unpadded(unit, grad_shards_[unit]), write};
  }
  first_write(unit, sums);  // fp32 sums go into the shards (grads_done): cleared if need be
  auto it = full_grads_.find(unit);
  if (it == full_grads_.end()) {
    std::vector<Tensor> full;
    for (size_t i = 0; i < layouts_[unit].size(); ++i)
      full.push_back(grad_shards_[unit][i].defined() ? ops::zeros(layouts_[unit][i].padded_shape(),
                                                                  DType::f32, *arenas_.gathered)
                                                     : Tensor());
    it = full_grads_.emplace(unit, std::move(full)).first;
  }
  return {unpadded(unit, it->second)};
}

GradWrite Zero3Parameters::first_write(int64_t unit, GradSums sums) {
  if (!shards_uncleared_.at(size_t(unit))) return GradWrite::kAdd;
  shards_uncleared_[size_t(unit)] = false;
  if (sums == GradSums::kOnce) return GradWrite::kOverwrite;
  updates_.wait(unit);  // its gradient shards are about to be written
  for (Tensor& g : grad_shards_[unit])
    if (g.defined()) ops::zero(g);
  return GradWrite::kAdd;
}

GradReduction Zero3Parameters::post_reduce_scatter(int64_t unit, std::vector<Tensor> full) {
  GradReduction r;
  r.unit = unit;
  r.full = std::move(full);
  if (alone()) {  // the whole unit is this rank's shard
    r.shard_sum = r.full;
    return r;
  }
  CommGroup group(comm_);
  for (size_t i = 0; i < r.full.size(); ++i) {
    if (!r.full[i].defined()) {  // frozen
      r.shard_sum.push_back(Tensor());
      continue;
    }
    r.shard_sum.push_back(
        Tensor::empty(layouts_[unit][i].shard_shape(), DType::f32, *arenas_.gathered));
    r.ops.push_back(comm_.reduce_scatter_sum(r.full[i], r.shard_sum[i]));
  }
  group.end();
  return r;
}

void Zero3Parameters::complete_reduction() {
  placement_.complete_download(grad_shards_);
  if (!in_flight_) return;
  for (Pending& op : in_flight_->ops) op->wait();
  const int64_t unit = in_flight_->unit;
  // A unit whose shards were already summed across the replicas this step (a tied embedding's
  // second gradients): this contribution crosses the replicas on its own before it is added.
  const bool summed = has_replicas() && replica_summed_[size_t(unit)];
  if (summed) wait_replica_sums();
  for (size_t i = 0; i < in_flight_->shard_sum.size(); ++i) {
    Tensor& sum = in_flight_->shard_sum[i];
    if (!sum.defined()) continue;  // frozen
    if (summed && !summed_elsewhere(unit, i)) replica_comm_for(sum).all_reduce_sum(sum)->wait();
    ops::add_inplace(grad_shards_[unit][i], sum);
  }
  in_flight_.reset();
  if (has_replicas() && last_micro_batch_ && !summed) post_replica_sum(unit);
  grads_final(unit);
}

bool Zero3Parameters::summed_elsewhere(int64_t unit, size_t i) const {
  return replicas_.summed_elsewhere && replicas_.summed_elsewhere(units_[size_t(unit)].params[i]);
}

Comm& Zero3Parameters::replica_comm_for(const Tensor& t) const {
  return t.device() == Device::cpu && replicas_.host_comm ? *replicas_.host_comm : *replicas_.comm;
}

void Zero3Parameters::post_replica_sum(int64_t unit) {
  replica_summed_[size_t(unit)] = true;
  for (size_t i = 0; i < grad_shards_[unit].size(); ++i) {
    Tensor& shard = grad_shards_[unit][i];
    if (!shard.defined() || summed_elsewhere(unit, i)) continue;  // frozen, or GaLore's
    // In the shards' own dtype: a bf16 run's gradients cross the nodes in bf16.
    replica_ops_.push_back(replica_comm_for(shard).all_reduce_sum(shard));
  }
}

void Zero3Parameters::finish_replica_sums() {
  for (size_t u = 0; u < units_.size(); ++u)
    if (!replica_summed_[u] && !grad_shards_[u].empty()) post_replica_sum(int64_t(u));
  wait_replica_sums();
}

void Zero3Parameters::wait_replica_sums() {
  for (Pending& op : replica_ops_) op->wait();
  replica_ops_.clear();
}

void Zero3Parameters::set_grads_final(std::function<void(int64_t)> on_final) {
  FRUGAL_CHECK(!on_final || (!has_replicas() && !placement_.host_state()),
               "per-layer updates with hybrid sharding or gradient shards in host memory");
  grads_final_ = std::move(on_final);
}

void Zero3Parameters::grads_done(int64_t unit) {
  if (direct_grads()) return grads_final(unit);
  if (grad_shards_handed_out_.at(size_t(unit))) {  // the backward added into them itself
    grad_shards_handed_out_[size_t(unit)] = false;
    return grads_final(unit);
  }
  updates_.wait(unit);  // its gradient shards are about to be written
  auto it = full_grads_.find(unit);
  FRUGAL_CHECK(it != full_grads_.end(), "grads_done of unit ", unit, " without gradients");
  std::vector<Tensor> full = std::move(it->second);
  full_grads_.erase(it);
  if (alone() && !placement_.host_state() && !has_replicas()) {
    // One rank with bf16 shards: the unit's fp32 sums go in, rounded once per micro-batch.
    for (size_t i = 0; i < full.size(); ++i)
      if (full[i].defined()) ops::add_inplace(grad_shards_[unit][i], full[i]);
    return grads_final(unit);
  }
  // One unit's gradients in flight at a time: the previous unit's reduce-scatter (or download)
  // ran beside this unit's backward; finishing it now bounds whole-size gradients to two units.
  complete_reduction();
  GradReduction r = post_reduce_scatter(unit, std::move(full));
  if (placement_.host_state())
    placement_.download(std::move(r), grad_shards_[unit]);  // the shards are in host memory
  else
    in_flight_ = std::move(r);
}

void Zero3Parameters::finish_backward() {
  complete_reduction();
  placement_.finish_backward(grad_shards_);
  for (size_t u = 0; u < units_.size(); ++u)  // no gradient reached these units
    if (shards_uncleared_[u]) first_write(int64_t(u), GradSums::kSeveral);
  FRUGAL_CHECK(full_grads_.empty(), full_grads_.size(),
               " units still hold whole gradients at the end of the backward");
  // The step's gradients are final: every unit's crosses the replicas (those posted during the
  // backward are waited for; gradient shards in host memory go now, over MPI).
  if (has_replicas() && last_micro_batch_) finish_replica_sums();
}

void Zero3Parameters::zero_grads() {
  FRUGAL_CHECK(replica_ops_.empty(), replica_ops_.size(),
               " sums across the replicas still in flight at the start of a step");
  std::fill(replica_summed_.begin(), replica_summed_.end(), false);
  if (clears_lazily()) {
    for (size_t u = 0; u < units_.size(); ++u) shards_uncleared_[u] = !grad_shards_[u].empty();
    return;
  }
  // (No wait for apply_update's thread: with it, the placement only marks the shards; the
  // gradients land in them after the forward has waited for every unit's update.)
  placement_.zero_grads(grad_shards_);
}

std::vector<TrainableShard> Zero3Parameters::trainable() {
  updates_.wait_all();
  std::vector<TrainableShard> out;
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t i = 0; i < units_[u].params.size(); ++i)
      if (units_[u].params[i].trainable)
        out.push_back({layouts_[u][i].name, shards_[u][i],
                       grad_shards_[u].empty() ? Tensor() : grad_shards_[u][i],
                       placement_.copy_for_optimizer(u, i), layouts_[u][i].rows_of(comm_.rank()),
                       int64_t(u)});
  return out;
}

size_t Zero3Parameters::shard_bytes() const {
  size_t bytes = 0;
  for (size_t u = 0; u < shards_.size(); ++u)
    for (size_t i = 0; i < shards_[u].size(); ++i) {
      if (shards_[u][i].defined()) bytes += shards_[u][i].bytes();
      if (encoded_[u][i])
        for (const EncodedPart& part : encoded_[u][i]->parts())
          if (part.data.defined()) bytes += part.data.bytes();
    }
  return bytes;
}

size_t Zero3Parameters::largest_unit_bytes(size_t weight_bytes) const {
  size_t largest = 0;
  for (size_t u = 0; u < layouts_.size(); ++u) {
    size_t bytes = 0;
    for (size_t i = 0; i < layouts_[u].size(); ++i) {
      const size_t n = size_t(shape_numel(layouts_[u][i].padded_shape()));
      bytes += n * weight_bytes + (units_[u].params[i].trainable ? n * 4 : 0);
    }
    largest = std::max(largest, bytes);
  }
  return largest;
}

}  // namespace frugal
