// Where ZeRO-3's state lives (device or pinned host memory, parallel.offload) and the copies
// between the two: the bf16 copies of the shards (made, staged, uploaded before a gather) and
// the gradient shards (downloaded after a reduce-scatter). The core (zero3_parameters.h) asks it
// what to gather from and hands it the reduced gradients; on the CPU it has nothing to move.
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"
#include "model/llama_config.h"
#include "ops/ops.h"
#include "parallel/comm.h"

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

// One unit's gradients on their way into the gradient shards: the whole-unit sums of this rank,
// the reduce-scatters posted on them (none on one rank) and this rank's rows of their sum over
// the ranks (`full` itself on one rank). Undefined where the parameter is frozen.
struct GradReduction {
  int64_t unit = -1;
  std::vector<Tensor> full, shard_sum;
  std::vector<Pending> ops;
};

// The shards themselves (master and gradient) belong to the core, which passes them in; this
// owns what is derived from them for the other memory: the bf16 copies, their host staging,
// which copies are out of date, and the gradients on their way down.
class Zero3Placement {
 public:
  explicit Zero3Placement(const Zero3Arenas& arenas) : arenas_(arenas) {}

  // A GPU run with the fp32 state in host memory (parallel.offload): the optimizer works on
  // the host, gradient shards come down and bf16 copies go up beside the compute stream.
  bool host_state() const { return arenas_.copies && arenas_.params->device() == Device::cpu; }
  // The layers read bf16 copies of the weights (a GPU), not the master shards (the CPU).
  bool has_copies() const { return arenas_.copies != nullptr; }
  // Where encoded (4-bit) weights are kept: on the GPU with the bf16 copies, or in host memory
  // (the CPU; offloaded copies, from where each gather uploads them).
  Arena& encoded_store() const;

  // --- weights ---------------------------------------------------------------------------
  // (Re)makes the bf16 copies of the defined master shards, by unit and parameter; an undefined
  // master (an encoded weight, or a frozen one whose copy was made before) keeps its copy.
  // Nothing on the CPU.
  void make_copies(const std::vector<std::vector<Tensor>>& shards);
  // The bf16 copy the optimizer writes beside the master shard (u, i), or undefined (the CPU,
  // or bf16 masters that are their own copies).
  Tensor copy_for_optimizer(size_t u, size_t i) const;
  // The optimizer changed the trainable weights of `units`: their copies on the GPU go up again
  // when next gathered.
  void weights_updated(const std::vector<UnitSpec>& units);
  // What the all-gather of the plain (not encoded) weight (unit, i) reads, on the gathering
  // device: its master shard (the CPU), its bf16 copy, or a copy of that on its way up (posted
  // in `uploads`).
  Tensor gather_source(int64_t unit, size_t i, const Tensor& shard,
                       std::vector<ops::SideCopy>& uploads);
  // `part` on the gathering device: itself, or a copy on its way up (posted in `uploads`).
  Tensor on_gathering_device(const Tensor& part, std::vector<ops::SideCopy>& uploads) const;

  // --- gradients (gradient shards by unit and parameter; undefined where frozen) -----------
  // Start of a step: zeros the gradient shards, or with host_state() marks them to be
  // overwritten by the first gradients that come down (no pass over host memory to clear them).
  void zero_grads(std::vector<std::vector<Tensor>>& grad_shards);
  // host_state(): the reduced gradients of r.unit go down into its gradient shards beside the
  // compute stream (after the reduce-scatters, on the same stream); added by complete_download.
  void download(GradReduction r, std::vector<Tensor>& unit_grad_shards);
  // Waits for the gradients on their way down and adds them in (nothing when none are).
  void complete_download(std::vector<std::vector<Tensor>>& grad_shards);
  // End of a backward: the download completed, and the shards that no gradient reached since
  // zero_grads cleared (host_state()).
  void finish_backward(std::vector<std::vector<Tensor>>& grad_shards);

  // Bytes the copies above moved between host and device memory (offload on a GPU), counted as
  // they are posted; the health monitor reads and clears them on its log steps.
  struct LinkBytes {
    int64_t to_device = 0;
    int64_t to_host = 0;
  };
  LinkBytes take_link_bytes() {
    const LinkBytes bytes = link_bytes_;
    link_bytes_ = LinkBytes();
    return bytes;
  }

 private:
  // Counts a copy that crosses between host and device memory.
  void count_copy(const Tensor& dst, const Tensor& src) const {
    if (dst.device() == src.device()) return;
    const int64_t bytes = int64_t(src.numel()) * int64_t(dtype_bytes(src.dtype()));
    (dst.device() == Device::cpu ? link_bytes_.to_host : link_bytes_.to_device) += bytes;
  }
  mutable LinkBytes link_bytes_;
  // Offloaded gradients on their way down: the unit's reduction (its device buffers kept until
  // the copies into host memory are done) and the landing buffers still to be added in.
  struct Download {
    GradReduction reduction;
    std::vector<Tensor> landing;
    std::vector<ops::SideCopy> copies;
  };

  Zero3Arenas arenas_;
  std::vector<std::vector<Tensor>> copies_;  // bf16 copies of the shards (GPU), else empty
  // host_state(): the bf16 copies the host optimizer writes (copies_ itself when the copies
  // are offloaded too), which copies that are on the GPU need again (stale_), and which
  // gradient shards have received nothing since zero_grads (fresh_: overwritten, not added).
  std::vector<std::vector<Tensor>> staging_;
  std::vector<std::vector<bool>> stale_;  // by unit and parameter
  std::vector<bool> fresh_;
  std::optional<Download> downloading_;
};

}  // namespace frugal
