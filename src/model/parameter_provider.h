// What the model asks of whoever holds its weights. The model does not know whether they are
// whole (one rank), sharded across ranks (ZeRO-3), quantized or offloaded: it gathers a unit
// just before it needs it, releases it right after, and hands back the unit's gradients.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/stateful.h"
#include "core/tensor.h"
#include "ops/fp8.h"
#include "ops/grad_write.h"

namespace frugal {

// A trainable slice this rank owns and the optimizer updates: the fp32 master values and the
// gradient that the backward accumulated for them.
struct TrainableShard {
  std::string name;  // the full parameter's Hugging Face name
  Tensor param;
  Tensor grad;
  Tensor param_copy;  // on a GPU: the bf16 copy the forward gathers, refreshed by the optimizer
  RowShard rows;      // which rows of the full parameter `param` holds (state of the same
                      // layout, such as AdamW's moments, is checkpointed by it)
  int64_t unit = -1;  // the unit it belongs to (per-layer updates update a unit's slices)
};

// How the backward adds into a unit's gradients during one micro-batch, which decides what
// grads() may hand out.
enum class GradSums {
  // Some gradient takes several adds (chunks, tied weights), or an op that adds only into fp32:
  // fp32 buffers, summed and then rounded once into bf16 gradient shards.
  kSeveral,
  // One add into each gradient, by ops that add into bf16 as well (on a GPU: linear_backward's
  // GEMM and rmsnorm_backward, each rounding once): bf16 gradient shards may be handed out as
  // they are, with the same one rounding per micro-batch and no fp32 buffer in between.
  kOnce,
};

// A unit's gradient buffers as grads() hands them out, and how the backward writes them: added
// into, or (kOnce only, the step's first micro-batch) overwritten, when the provider left them
// uncleared at the step's start.
struct UnitGrads {
  std::vector<Tensor> tensors;  // in UnitSpec order, undefined where frozen
  GradWrite write = GradWrite::kAdd;
};

class ParameterProvider {
 public:
  virtual ~ParameterProvider() = default;

  // Hint that `unit` will be gathered soon (ZeRO-3 posts its all-gather now).
  virtual void prefetch(int64_t /*unit*/) {}
  // The full weights of `unit`, in UnitSpec order, valid until release(unit).
  virtual std::vector<Tensor> gather(int64_t unit) = 0;
  // Like gather, except that weights the provider keeps compressed (4-bit) come back
  // undefined: materialize(unit, i) makes one when it is about to be used, and it is gone
  // when the caller drops it. A QLoRA layer then holds one projection in bf16 at a time
  // instead of seven. Providers that compress nothing give gather's weights.
  virtual std::vector<Tensor> gather_compressed(int64_t unit) { return gather(unit); }
  virtual Tensor materialize(int64_t unit, size_t i);
  // A weight gather_compressed left undefined, as the E4M3 codes an FP8 GEMM reads: [rows, cols],
  // or [cols, rows] if `transposed` (the dgrad operand), with their inverse scale. A weight that
  // came as E4M3 codes (ZeRO-3's FP8 weight gathers) comes as it is, with its own scale, the
  // same as `slot`'s; a 4-bit one is decoded straight to E4M3 with `slot`'s scale, raising its
  // amax (WeightEncoding::decode_fp8). None for any other weight: materialize makes those, and
  // the caller casts.
  virtual std::optional<ops::Fp8Matrix> fp8_weight(int64_t /*unit*/, size_t /*i*/,
                                                   const ops::Fp8Slot& /*slot*/,
                                                   bool /*transposed*/) {
    return std::nullopt;
  }
  virtual void release(int64_t unit) = 0;

  // Full-size gradient buffers of `unit` to write into as UnitGrads::write says (+= unless
  // kOnce lets the provider skip clearing them); valid until grads_done. `sums` says how they
  // will be added into (fp32 unless kOnce lets bf16 shards through).
  virtual UnitGrads grads(int64_t unit, GradSums sums) = 0;
  // The backward has finished adding into grads(unit) for this micro-batch (ZeRO-3 starts
  // the reduce-scatter). May be called more than once per step for a tied unit.
  virtual void grads_done(int64_t unit) = 0;
  // All grads_done of this micro-batch have been issued; wait for outstanding reductions.
  virtual void finish_backward() {}

  // Start of an optimizer step: the gradients start from zero (cleared now, or overwritten by
  // their first write: UnitGrads::write).
  virtual void zero_grads() = 0;
  // A micro-batch's forward and backward follow; `last`: the step's last one, after which the
  // gradients are final (hybrid sharding sums each unit's across the replicas as they come in).
  // Without the call every micro-batch counts as the last.
  virtual void begin_micro_batch(bool /*last*/) {}
  // Per-layer updates (train/per_layer_updates.h): in the step's last micro-batch, `on_final`
  // hears each unit as soon as its gradient shards hold their final sums for the step (ZeRO-3:
  // the unit's reduce-scatter is complete; one rank: at its grads_done), in the backward's order,
  // on the calling thread, with the unit released by the model; it may update that unit's
  // slices. A tied unit is heard at each of its grads_done. Empty: none (the default).
  virtual void set_grads_final(std::function<void(int64_t unit)> on_final) {
    if (on_final) fail("this parameter provider cannot tell when a unit's gradients are final");
  }
  // The optimizer has changed the trainable shards (copies of them must be made again).
  virtual void weights_updated() {}
  // The optimizer's update: update_slice(k) for every trainable slice k < n_slices
  // (trainable()'s order), then weights_updated(). ZeRO-3 with the optimizer on the host
  // (offload) runs them on a thread of their own, unit by unit in forward order, and makes each
  // unit's gather wait for that unit's updates: the next forward runs on the GPU while the
  // host updates the units after it. update_slice must touch only slice k's tensors.
  virtual void apply_update(size_t n_slices, std::function<void(size_t)> update_slice) {
    for (size_t k = 0; k < n_slices; ++k) update_slice(k);
    weights_updated();
  }
  // Returns once every update of apply_update is done (and rethrows its error): before
  // anything but a gather reads the weights or the optimizer state (checkpoints).
  virtual void wait_for_updates() {}
  // This rank's trainable slices, for the optimizer and the gradient norm.
  virtual std::vector<TrainableShard> trainable() = 0;
};

inline Tensor ParameterProvider::materialize(int64_t unit, size_t i) {
  fail("parameter ", i, " of unit ", unit, " is not compressed: gather gives it whole");
}

// Deterministic initialisation that depends only on (seed, name, row), so that any
// sharding of the rows produces the same model: norms are ones, every other weight is
// normal(0, std) with rows drawn from their own counter-based stream.
void init_parameter_rows(Tensor& rows, const std::string& name, int64_t first_row, uint64_t seed,
                         float std);
// Whether init_parameter_rows draws the named weight from normal(0, std) (not a norm, not a LoRA
// matrix), and the key of its rows' streams for kernels/normal_init.h: a device that makes the
// rows itself (ops::normal_rows) makes the same numbers.
bool init_is_normal(const std::string& name);
uint64_t init_row_key(const std::string& name, uint64_t seed);

}  // namespace frugal
