// ZeRO-3: every rank holds 1/N of every weight (a block of rows, padded so N divides the row
// count), of its gradient and of its optimizer state. A unit's weights are all-gathered just
// before use and dropped right after; its gradients are reduce-scattered as soon as its
// backward ends, so at most two units are ever whole on a rank.
//
// Three concerns apart: this class shards, gathers (with prefetch) and reduces; where the state
// lives and the copies between device and host are Zero3Placement's (zero3_placement.h); frozen
// weights kept in fewer bytes (NF4, HQQ) are a WeightEncoding each (weight_encoding.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/parameter_provider.h"
#include "ops/fp8.h"
#include "ops/ops.h"
#include "optim/background_updates.h"
#include "parallel/comm.h"
#include "parallel/shard_layout.h"
#include "parallel/weight_encoding.h"
#include "parallel/zero3_placement.h"

namespace frugal {

// Where the first weights come from, and which frozen ones are kept encoded (4-bit).
struct Zero3Init {
  // Fills rows [first, last) of the named parameter (e.g. from a Hugging Face directory) and
  // returns true, or returns false for the seed's initialisation. Null: the seed everywhere.
  std::function<bool(const std::string& name, int64_t first, int64_t last, Tensor& rows)> load_rows;
  // Frozen parameters it picks are stored as NF4 rows (QLoRA's base, Nf4Encoding): quantized
  // exactly as bitsandbytes quantizes the whole tensor (a collective: the absmax offset and
  // second-level scales need every rank's rows), never held in fp32 beyond one tensor's rows.
  std::function<bool(const ParamSpec&)> nf4;
  // Frozen parameters it picks are stored as HQQ 4-bit rows (HqqEncoding: group 64, zero and
  // scale per group, the half-quadratic zero fit with the whole matrix's early stop).
  std::function<bool(const ParamSpec&)> hqq;
  // Any other encoding of frozen parameters: a new, not yet encoded WeightEncoding for those it
  // picks (asked after nf4 and hqq), null for the others.
  std::function<std::unique_ptr<WeightEncoding>(const ParamSpec&)> encoding;
  // FP8 training's weight gathers: trainable weights it gives a scaling slot for are gathered as
  // E4M3 codes while set_fp8_gathers(true) holds. Each rank casts its own rows with the slot's
  // scale (raising the slot's amax by them) and the ranks gather the codes: one byte per weight,
  // half of bf16's. The scale must be the same on every rank of `comm` (delayed scaling: the
  // weight amaxes agree over these ranks at each step's end, Fp8Scaling::end_step).
  std::function<std::optional<ops::Fp8Slot>(const ParamSpec&)> fp8_gather;
};

// Hybrid sharding (HSDP): the replicas of the sharded model on other ranks (the mesh's replica
// group), whose gradient shards this one's are summed with once per step.
struct Zero3Replicas {
  Comm* comm = nullptr;  // null or one rank: no replicas
  // The same ranks over MPI, for gradient shards in host memory (offload on a GPU); null: comm.
  Comm* host_comm = nullptr;
  // Parameters whose gradients cross the replicas in another form (GaLore's projections, summed
  // by the optimizer): their gradient shards stay this replica's sums.
  std::function<bool(const ParamSpec&)> summed_elsewhere;
};

class Zero3Parameters : public ParameterProvider {
 public:
  // Shards `units` over `comm`; each rank initialises only its own rows (init_parameter_rows,
  // so the model equals a one-rank model of the same seed, or init.load_rows).
  // With `replicas`, `comm` is one replica's ranks, and every gradient shard (but those
  // summed_elsewhere) is all-reduced across the replicas in the step's last micro-batch, each
  // unit's as soon as its reduce-scatter is done, beside the backward of the units after it.
  Zero3Parameters(std::vector<UnitSpec> units, Comm& comm, const Zero3Arenas& arenas, uint64_t seed,
                  float init_std, bool with_grads = true, const Zero3Init& init = {},
                  const Zero3Replicas& replicas = {});
  ~Zero3Parameters() override;
  // Host <-> device bytes moved since the last call (offload on a GPU; zero otherwise).
  Zero3Placement::LinkBytes take_link_bytes() { return placement_.take_link_bytes(); }

  void prefetch(int64_t unit) override;
  std::vector<Tensor> gather(int64_t unit) override;
  // Encoded weights undefined, decoded one at a time by materialize (their gathered parts
  // stay until release).
  std::vector<Tensor> gather_compressed(int64_t unit) override;
  Tensor materialize(int64_t unit, size_t i) override;
  // The codes of a weight gathered as FP8 or of an encoded one whose encoding decodes straight to
  // E4M3 (gather_compressed leaves both undefined).
  std::optional<ops::Fp8Matrix> fp8_weight(int64_t unit, size_t i, const ops::Fp8Slot& slot,
                                           bool transposed) override;
  // FP8 weight gathers on (a training step's forward and backward, whose GEMMs read E4M3) or
  // off (evaluation and anything else that wants the weights as they are). Switched only
  // between steps: no unit with such a weight may be gathered then. On one rank, the codes kept
  // for the step are dropped at either switch.
  void set_fp8_gathers(bool on);
  // Whether any weight is gathered as FP8 while set_fp8_gathers(true) holds.
  bool has_fp8_gathers() const;
  void release(int64_t unit) override;
  UnitGrads grads(int64_t unit, GradSums sums) override;
  void grads_done(int64_t unit) override;
  void finish_backward() override;
  void zero_grads() override;
  void begin_micro_batch(bool last) override { last_micro_batch_ = last; }
  // Per-layer updates: heard when a unit's gradient shards are final (its reduce-scatter
  // complete; at grads_done where nothing is reduced). Not with hybrid sharding or gradient
  // shards in host memory (offload): the run refuses those (train_config.cpp, training_run.cpp).
  void set_grads_final(std::function<void(int64_t)> on_final) override;
  void weights_updated() override;
  // With the optimizer on the host (offload), in the background unit by unit (see
  // ParameterProvider); otherwise at once.
  void apply_update(size_t n_slices, std::function<void(size_t)> update_slice) override;
  void wait_for_updates() override;
  std::vector<TrainableShard> trainable() override;

  const std::vector<UnitSpec>& units() const { return units_; }
  Comm& comm() const { return comm_; }
  const ShardLayout& layout(int64_t unit, size_t i) const { return layouts_[unit][i]; }
  Tensor& shard(int64_t unit, size_t i) {
    updates_.wait_all();
    return shards_[unit][i];
  }
  // After the master shards changed other than through the optimizer (a checkpoint or weights
  // loaded into them): the bf16 copies are made again. Nothing to do on the CPU.
  void refresh_copies();
  // Bytes of this rank's shards (padding included), and of the largest unit while it is whole:
  // its weights at `weight_bytes` an element (the compute dtype's) and its trainable weights'
  // fp32 gradients.
  size_t shard_bytes() const;  // encoded weights counted as their parts' bytes
  bool is_quantized(int64_t unit, size_t i) const { return encoded_[unit][i] != nullptr; }
  size_t largest_unit_bytes(size_t weight_bytes) const;

 private:
  struct Gathered {
    std::vector<Tensor> full;  // [rows_padded, ...] per parameter; undefined where encoded and
                               // not decoded (yet)
    std::vector<std::vector<Tensor>> parts;  // encoded weights: their whole parts; else empty
    std::vector<std::optional<ops::Fp8Matrix>> fp8;  // weights gathered as FP8: [rows, cols]
    std::vector<Pending> ops;
    std::vector<ops::SideCopy> uploads;  // offloaded copies and parts on their way to the GPU
    int users = 0;
  };
  Gathered& post_gather(int64_t unit);
  Gathered& wait_gathered(int64_t unit);  // the gathers and uploads done, one more user
  Tensor decode(int64_t unit, size_t i, const Gathered& g) const;  // [rows_padded, ...]
  bool gathered_as_fp8(int64_t unit, size_t i) const {
    return fp8_gathers_ && fp8_slots_[unit][i].has_value();
  }
  // This rank's rows of a weight gathered as FP8: its E4M3 codes [shard_rows, cols].
  Tensor fp8_rows(int64_t unit, size_t i, const Tensor& source, Gathered& g);
  GradReduction post_reduce_scatter(int64_t unit, std::vector<Tensor> full);
  void complete_reduction();
  // Hybrid sharding: the all-reduce of unit's gradient shards across the replicas (posted);
  // all of them done (every unit's not yet posted, posted first).
  bool has_replicas() const { return replicas_.comm && replicas_.comm->size() > 1; }
  void post_replica_sum(int64_t unit);
  bool summed_elsewhere(int64_t unit, size_t i) const;
  void finish_replica_sums();
  void wait_replica_sums();  // those posted
  Comm& replica_comm_for(const Tensor& t) const;
  std::vector<Tensor> unpadded(int64_t unit, const std::vector<Tensor>& full) const;

  std::vector<UnitSpec> units_;
  std::vector<std::vector<ShardLayout>> layouts_;
  Comm& comm_;
  Zero3Arenas arenas_;
  // One rank needs no collective: the shards are the whole weights and gradients.
  bool alone() const { return comm_.size() == 1; }
  // One rank, no replicas, its gradient shards on the device the backward runs on: nothing
  // to reduce or move, so the backward may add into the shards themselves.
  bool grad_shards_at_hand() const {
    return alone() && !has_replicas() && arenas_.grads->device() == arenas_.gathered->device();
  }
  // fp32 shards: every backward accumulates straight into them.
  bool direct_grads() const { return grad_shards_at_hand() && arenas_.master == DType::f32; }
  // bf16 shards on a GPU: a backward that adds once into each gradient (GradSums::kOnce) takes
  // them directly instead of fp32 sums added in afterwards.
  bool direct_bf16_grads() const {
    return grad_shards_at_hand() && arenas_.grads->device() != Device::cpu &&
           arenas_.master == DType::bf16;
  }

  // By unit and parameter: the master shards (undefined where encoded, and for a frozen weight
  // on a GPU, which needs only its copy), the gradient shards (undefined where frozen; none
  // without gradients), and the encoded weights (null where not).
  std::vector<std::vector<Tensor>> shards_, grad_shards_;
  // By unit: its bf16 gradient shards were handed out by grads() this micro-batch
  // (direct_bf16_grads), so grads_done has nothing to add.
  std::vector<bool> grad_shards_handed_out_;
  // Shards at hand (direct_grads, direct_bf16_grads): zero_grads leaves them as they are (a
  // pass over every gradient each step, 2.2 GB at the 1.1B shape in bf16) and marks them here.
  // A unit's first grads() decides (first_write): a backward that writes each gradient once
  // (kOnce) overwrites them, any other clears them first; finish_backward clears those that no
  // gradient reached.
  bool clears_lazily() const { return direct_grads() || direct_bf16_grads(); }
  GradWrite first_write(int64_t unit, GradSums sums);
  std::vector<bool> shards_uncleared_;
  std::vector<std::vector<std::unique_ptr<WeightEncoding>>> encoded_;
  // The scaling slots of the weights gathered as FP8 while fp8_gathers_ (none for the others).
  std::vector<std::vector<std::optional<ops::Fp8Slot>>> fp8_slots_;
  bool fp8_gathers_ = false;
  // One rank alone: each FP8 weight's codes, cast at its first gather of a step and kept until
  // FP8 gathers end (the step's end). A weight and its delayed scale change only between steps,
  // so the backward's gather, and every micro-batch's, would cast the same codes again (3 bytes
  // of traffic a weight) or send them nowhere. Costs one byte a weight for the step
  // (MemoryPlan::fp8_codes). By unit, then parameter.
  std::map<std::pair<int64_t, size_t>, Tensor> step_fp8_codes_;
  Zero3Placement placement_;
  std::map<int64_t, Gathered> gathered_;
  std::map<int64_t, std::vector<Tensor>> full_grads_;
  // The last unit's reduce-scatter while the next unit's backward runs (gradient shards on the
  // gathering device; with host_state() the placement's download holds it instead).
  std::optional<GradReduction> in_flight_;
  // Hybrid sharding: the replicas, whether this micro-batch is the step's last, which units'
  // shards are summed across the replicas (or their sums posted) this step, and those in flight.
  Zero3Replicas replicas_;
  bool last_micro_batch_ = true;
  // Per-layer updates' listener, and the call that tells it (on the last micro-batch).
  std::function<void(int64_t)> grads_final_;
  void grads_final(int64_t unit) {
    if (grads_final_ && last_micro_batch_) grads_final_(unit);
  }
  std::vector<bool> replica_summed_;
  std::vector<Pending> replica_ops_;
  // apply_update's host optimizer, unit by unit (host_state()); declared last, so destroyed
  // (its thread joined) before the tensors it updates.
  BackgroundUpdates updates_;
};

}  // namespace frugal
