// The trainable master weights of a ZeRO-3 model as checkpoint state: "model/<hf name>", each
// rank's rows of its shard. Frozen weights (a LoRA base) are not saved: they come from
// model.hf_path or the seed again, as at the start.
#pragma once

#include "core/stateful.h"
#include "parallel/zero3_parameters.h"

namespace frugal {

class Zero3State : public Stateful {
 public:
  explicit Zero3State(Zero3Parameters& params) : params_(params) {}

  std::vector<StateTensor> state_tensors() override;
  // A host optimizer may still be updating the shards (offload): wait for it.
  void before_save() override { params_.wait_for_updates(); }
  // The loaded master shards make the bf16 copies again.
  void after_load() override { params_.refresh_copies(); }

 private:
  Zero3Parameters& params_;
};

}  // namespace frugal
