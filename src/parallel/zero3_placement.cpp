// ZeRO-3's placement: the bf16 copies and their way up, the gradient shards and their way down.
#include "parallel/zero3_placement.h"

namespace frugal {

Arena& Zero3Placement::encoded_store() const {
  return arenas_.copies && arenas_.copies->device() == Device::cuda ? *arenas_.copies
                                                                    : *arenas_.params;
}

void Zero3Placement::make_copies(const std::vector<std::vector<Tensor>>& shards) {
  if (!arenas_.copies) return;
  copies_.resize(shards.size());
  staging_.resize(shards.size());
  stale_.assign(shards.size(), {});
  fresh_.assign(shards.size(), true);
  for (size_t u = 0; u < shards.size(); ++u) {
    copies_[u].resize(shards[u].size());
    staging_[u].resize(shards[u].size());
    stale_[u].assign(shards[u].size(), true);
    for (size_t i = 0; i < shards[u].size(); ++i) {
      const Tensor& master = shards[u][i];
      // 4-bit (gathered and dequantized as such), or frozen on a GPU: its copy stays as it is.
      if (!master.defined()) continue;
      if (master.dtype() == DType::bf16) {  // a bf16 run: the master is the copy
        copies_[u][i] = master;
        continue;
      }
      // Into the existing tensors: the optimizer holds them (TrainableShard::param_copy).
      auto make = [](Tensor& slot, const Tensor& value) {
        if (slot.defined())
          ops::copy(slot, value);
        else
          slot = value;
      };
      if (host_state()) {
        // Rounded on the host, where the optimizer will round them from now on; copies on
        // the GPU are uploaded from there when next gathered (stale_).
        Tensor& staging = arenas_.copies->device() == Device::cpu ? copies_[u][i] : staging_[u][i];
        make(staging, ops::convert(master, DType::bf16, *arenas_.params));
        if (arenas_.copies->device() != Device::cpu && !copies_[u][i].defined())
          copies_[u][i] = Tensor::empty(master.shape(), DType::bf16, *arenas_.copies);
      } else {
        make(copies_[u][i], ops::convert(master, DType::bf16, *arenas_.copies));
      }
    }
  }
}

Tensor Zero3Placement::copy_for_optimizer(size_t u, size_t i) const {
  if (copies_.empty() || arenas_.master == DType::bf16) return Tensor();
  // A host optimizer writes host memory; the GPU's writes the GPU's copies.
  if (host_state() && arenas_.copies->device() != Device::cpu) return staging_[u][i];
  return copies_[u][i];
}

void Zero3Placement::weights_updated(const std::vector<UnitSpec>& units) {
  // The trainable ones changed; a frozen weight's copy on the GPU is still what it was.
  if (!host_state()) return;
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t i = 0; i < units[u].params.size(); ++i)
      if (units[u].params[i].trainable) stale_[u][i] = true;
}

Tensor Zero3Placement::gather_source(int64_t unit, size_t i, const Tensor& shard,
                                     std::vector<ops::SideCopy>& uploads) {
  if (!arenas_.copies) return shard;  // the CPU: the fp32 shards are gathered
  Tensor source = copies_[unit][i];
  if (!host_state()) return source;
  // The host optimizer wrote the bf16 copies in host memory: up they go, beside the compute
  // stream, once per update (copies kept on the GPU) or every time (offloaded).
  const bool kept_on_gpu = arenas_.copies->device() != Device::cpu;
  if (kept_on_gpu && !stale_[unit][i]) return source;
  const Tensor& host = kept_on_gpu ? staging_[unit][i] : copies_[unit][i];
  if (!kept_on_gpu) source = Tensor::empty(host.shape(), DType::bf16, *arenas_.gathered);
  count_copy(source, host);
  uploads.emplace_back(source, host);
  stale_[unit][i] = false;
  return source;
}

Tensor Zero3Placement::on_gathering_device(const Tensor& part,
                                           std::vector<ops::SideCopy>& uploads) const {
  if (!part.defined() || part.device() == arenas_.gathered->device()) return part;
  Tensor up = Tensor::empty(part.shape(), part.dtype(), *arenas_.gathered);
  count_copy(up, part);
  uploads.emplace_back(up, part);
  return up;
}

void Zero3Placement::zero_grads(std::vector<std::vector<Tensor>>& grad_shards) {
  if (host_state()) {
    // The first gradients of each unit overwrite its shards instead of adding to them (no
    // pass over host memory to clear them); finish_backward clears those that got none.
    fresh_.assign(grad_shards.size(), true);
    return;
  }
  for (auto& unit : grad_shards)
    for (Tensor& g : unit)
      if (g.defined()) ops::zero(g);
}

void Zero3Placement::download(GradReduction r, std::vector<Tensor>& unit_grad_shards) {
  Download d;
  const int64_t unit = r.unit;
  // The reduce-scatter and the copies both run on the communication stream, in order.
  for (size_t i = 0; i < unit_grad_shards.size(); ++i) {
    Tensor& shard = unit_grad_shards[i];
    if (!shard.defined()) {  // frozen
      d.landing.push_back(Tensor());
      continue;
    }
    Tensor landing =
        fresh_[unit] ? Tensor() : Tensor::empty(shard.shape(), DType::f32, *arenas_.grads);
    d.landing.push_back(landing);
    count_copy(shard, r.shard_sum[i]);
    d.copies.emplace_back(fresh_[unit] ? shard : d.landing.back(), r.shard_sum[i]);
  }
  fresh_[unit] = false;
  d.reduction = std::move(r);
  downloading_ = std::move(d);
}

void Zero3Placement::complete_download(std::vector<std::vector<Tensor>>& grad_shards) {
  if (!downloading_) return;
  Download& d = *downloading_;
  // The copies follow the reduce-scatters on the communication stream: once they are done,
  // so are those, and the device buffers can go.
  for (ops::SideCopy& copy : d.copies) copy.done();
  d.reduction.ops.clear();
  for (size_t i = 0; i < d.landing.size(); ++i)
    if (d.landing[i].defined()) ops::add_inplace(grad_shards[d.reduction.unit][i], d.landing[i]);
  downloading_.reset();
}

void Zero3Placement::finish_backward(std::vector<std::vector<Tensor>>& grad_shards) {
  complete_download(grad_shards);
  if (host_state())
    for (size_t u = 0; u < grad_shards.size(); ++u)
      if (fresh_[u] && !grad_shards[u].empty()) {
        for (Tensor& g : grad_shards[u])
          if (g.defined()) ops::zero(g);  // no gradient reached this unit
        fresh_[u] = false;
      }
}

}  // namespace frugal
