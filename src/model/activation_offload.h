// Activation offload: the blocks' checkpointed inputs x kept in host memory (pinned on a GPU)
// between the forward and the backward, so that the activations on the device no longer grow
// with layers x tokens. The forward copies each block's input down beside the compute (on the
// GPU's communication stream) while the block runs; the backward brings layer i - 1's input back
// while layer i is recomputed and differentiated, so the copies hide behind the compute.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace frugal {

class InputOffload {
 public:
  // Inputs of `layers` blocks go to `host` (a pinned arena on a GPU: the copies are then
  // asynchronous). The last block's input stays where it is: the backward starts with it.
  InputOffload(Arena& host, int64_t layers);

  // Whether `layer`'s input goes to host memory.
  bool offloads(int64_t layer) const { return layer + 1 < layers_; }
  // Starts copying block `layer`'s input x to host memory (queued after the compute so far:
  // call it before the block's forward is queued, which it then overlaps). The copy holds x's
  // device memory until it is joined, two layers later or by finish_forward.
  void store(int64_t layer, const Tensor& x);
  // Joins every copy to host memory: the device keeps none of the stored inputs.
  void finish_forward();
  // Starts bringing block `layer`'s input back into the compute memory of `like`'s device
  // (call it a layer ahead: it overlaps the layer being differentiated).
  void fetch(int64_t layer, const Tensor& like);
  // Block `layer`'s input on the device, the compute ordered after its copy (fetched here if
  // fetch was not called). Its host copy is given back.
  Tensor take(int64_t layer, const Tensor& like);

 private:
  Arena& host_;
  int64_t layers_;
  std::vector<Tensor> host_inputs_;    // by layer: in host memory between store and take
  std::vector<Tensor> device_inputs_;  // by layer: fetched, not yet taken
  std::vector<ops::SideCopy> copies_;  // by layer: in flight until joined
};

}  // namespace frugal
