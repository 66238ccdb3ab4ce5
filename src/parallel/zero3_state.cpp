// The trainable master shards, named for checkpoints.
#include "parallel/zero3_state.h"

namespace frugal {

std::vector<StateTensor> Zero3State::state_tensors() {
  std::vector<StateTensor> state;
  const int rank = params_.comm().rank();
  for (size_t u = 0; u < params_.units().size(); ++u)
    for (size_t i = 0; i < params_.units()[u].params.size(); ++i)
      if (params_.units()[u].params[i].trainable) {
        const ShardLayout& l = params_.layout(u, i);
        state.push_back({"model/" + l.name, params_.shard(u, i), l.rows_of(rank)});
      }
  return state;
}

}  // namespace frugal
