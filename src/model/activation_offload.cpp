// The blocks' inputs to host memory and back; see activation_offload.h.
#include "model/activation_offload.h"

#include "core/error.h"

namespace frugal {

InputOffload::InputOffload(Arena& host, int64_t layers)
    : host_(host), layers_(layers), host_inputs_(layers), device_inputs_(layers), copies_(layers) {}

void InputOffload::store(int64_t layer, const Tensor& x) {
  FRUGAL_CHECK(offloads(layer) && !host_inputs_[size_t(layer)].defined(),
               "activation offload: block ", layer, "'s input stored twice or not offloaded");
  Tensor& host = host_inputs_[size_t(layer)] = Tensor::empty(x.shape(), x.dtype(), host_);
  copies_[size_t(layer)] = ops::SideCopy(host, x);
  // The copy of two layers ago is over by now (it ran beside that block's forward): joining it
  // lets the device reuse that input's memory, and rarely waits.
  if (layer >= 2) copies_[size_t(layer - 2)] = ops::SideCopy();
}

void InputOffload::finish_forward() {
  for (ops::SideCopy& copy : copies_) copy = ops::SideCopy();
}

void InputOffload::fetch(int64_t layer, const Tensor& like) {
  const Tensor& host = host_inputs_[size_t(layer)];
  FRUGAL_CHECK(host.defined() && !device_inputs_[size_t(layer)].defined(),
               "activation offload: block ", layer, "'s input is not in host memory");
  Tensor& device = device_inputs_[size_t(layer)] =
      ops::empty_like(like, host.shape(), host.dtype());
  copies_[size_t(layer)] = ops::SideCopy(device, host);
  host_inputs_[size_t(layer)] = Tensor();  // the copy holds it until it is joined
}

Tensor InputOffload::take(int64_t layer, const Tensor& like) {
  if (!device_inputs_[size_t(layer)].defined()) fetch(layer, like);
  copies_[size_t(layer)].wait();
  // The layer above's copy was waited for before its recompute: joining it never blocks.
  if (layer + 1 < layers_) copies_[size_t(layer + 1)] = ops::SideCopy();
  Tensor x = std::move(device_inputs_[size_t(layer)]);
  device_inputs_[size_t(layer)] = Tensor();
  return x;
}

}  // namespace frugal
