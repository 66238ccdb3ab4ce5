// ZeRO-3: every rank holds 1/N of every weight (a block of rows, padded so N divides the row
// count), of its gradient and of its optimizer state. A unit's weights are all-gathered just
// before use and dropped right after; its gradients are reduce-scattered as soon as its
// backward ends, so at most two units are ever whole on a rank.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/parameter_provider.h"
#include "ops/ops.h"
#include "optim/background_updates.h"
#include "parallel/comm.h"
#include "parallel/shard_layout.h"
#include "parallel/weight_encoding.h"

namespace frugal {

// Where the buffers of the sharded model live; each arena is its own accounting domain.
struct Zero3Arenas {
  Arena* params;    // fp32 master shards
  Arena* grads;     // gradient shards
  Arena* gathered;  // whole units in use: gathered weights and full-size gradients
  // On a GPU: where the bf16 copies of the shards live, which are what the ranks gather (half
  // the bytes of fp32) and the layers read. Null on the CPU: the fp32 shards are gathered.
  Arena* copies = nullptr;
  // The dtype of the master shards and gradient shards (and so of the optimizer's moments).
  // bf16 (a GPU run with optim.state_dtype = bf16, the arithmetic of a bf16 PyTorch model): a
  // master shard is its own bf16 copy, and whole-unit fp32 gradients are added into bf16
  // shards; 8 bytes per trainable weight with AdamW instead of 18.
  DType master = DType::f32;
};

// Where the first weights come from, and which frozen ones are kept encoded (4-bit).
struct Zero3Init {
  // Fills rows [first, last) of the named parameter (e.g. from a Hugging Face directory) and
  // returns true, or returns false for the seed's initialisation. Null: the seed everywhere.
  std::function<bool(const std::string& name, int64_t first, int64_t last, Tensor& rows)>
      load_rows;
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
};

class Zero3Parameters : public ParameterProvider {
 public:
  // Shards `units` over `comm`; each rank initialises only its own rows (init_parameter_rows,
  // so the model equals a one-rank model of the same seed, or init.load_rows).
  Zero3Parameters(std::vector<UnitSpec> units, Comm& comm, const Zero3Arenas& arenas,
                  uint64_t seed, float init_std, bool with_grads = true,
                  const Zero3Init& init = {});
  ~Zero3Parameters() override;

  void prefetch(int64_t unit) override;
  std::vector<Tensor> gather(int64_t unit) override;
  // Encoded weights undefined, decoded one at a time by materialize (their gathered parts
  // stay until release).
  std::vector<Tensor> gather_compressed(int64_t unit) override;
  Tensor materialize(int64_t unit, size_t i) override;
  void release(int64_t unit) override;
  std::vector<Tensor> grads(int64_t unit) override;
  void grads_done(int64_t unit) override;
  void finish_backward() override;
  void zero_grads() override;
  void weights_updated() override;
  // With the optimizer on the host (offload), in the background unit by unit (see
  // ParameterProvider); otherwise at once.
  void apply_update(size_t n_slices, std::function<void(size_t)> update_slice) override;
  void wait_for_updates() override;
  std::vector<TrainableShard> trainable() override;

  const std::vector<UnitSpec>& units() const { return units_; }
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
    std::vector<Pending> ops;
    std::vector<ops::SideCopy> uploads;  // offloaded copies and parts on their way to the GPU
    int users = 0;
  };
  // Offloaded gradients on their way down: the unit's device buffers, kept until the copies
  // into host memory are done, and the landing buffers still to be added into the shards.
  struct Download {
    int64_t unit = -1;
    std::vector<Tensor> device, landing;
    std::vector<Pending> reductions;
    std::vector<ops::SideCopy> copies;
  };
  struct Reduction {
    int64_t unit = -1;
    std::vector<Tensor> full, shard_sum;
    std::vector<Pending> ops;
  };
  Gathered& post_gather(int64_t unit);
  Gathered& wait_gathered(int64_t unit);  // the gathers and uploads done, one more user
  Tensor decode(int64_t unit, size_t i, const Gathered& g) const;  // [rows_padded, ...]
  void complete_reduction();
  std::vector<Tensor> unpadded(int64_t unit, const std::vector<Tensor>& full) const;

  std::vector<UnitSpec> units_;
  std::vector<std::vector<ShardLayout>> layouts_;
  Comm& comm_;
  Zero3Arenas arenas_;
  // One rank needs no collective: the shards are the whole weights and gradients.
  bool alone() const { return comm_.size() == 1; }
  // One rank whose backward can accumulate straight into its fp32 gradient shards.
  bool direct_grads() const {
    return alone() && arenas_.grads->device() == arenas_.gathered->device() &&
           arenas_.master == DType::f32;
  }
  // A GPU run with the fp32 state in host memory (parallel.offload): the optimizer works on
  // the host, gradient shards come down and bf16 copies go up beside the compute stream.
  bool host_state() const { return arenas_.copies && arenas_.params->device() == Device::cpu; }
  void complete_download();
  Tensor copy_for_optimizer(size_t unit, size_t i) const;

  std::vector<std::vector<Tensor>> shards_, grad_shards_;  // shards_: undefined where encoded
  std::vector<std::vector<std::unique_ptr<WeightEncoding>>> encoded_;  // null where not
  std::vector<std::vector<Tensor>> copies_;  // bf16 copies of shards_ (GPU), else empty
  // host_state(): the bf16 copies the host optimizer writes (copies_ itself when the copies
  // are offloaded too), which copies that are on the GPU need again (stale_), and which
  // gradient shards have received nothing since zero_grads (fresh_: overwritten, not added).
  std::vector<std::vector<Tensor>> staging_;
  std::vector<std::vector<bool>> stale_;  // by unit and parameter
  std::vector<bool> fresh_;
  std::optional<Download> downloading_;
  std::map<int64_t, Gathered> gathered_;
  std::map<int64_t, std::vector<Tensor>> full_grads_;
  std::optional<Reduction> in_flight_;
  // apply_update's host optimizer, unit by unit (host_state()); declared last, so destroyed
  // (its thread joined) before the tensors it updates.
  BackgroundUpdates updates_;
};

}  // namespace frugal
