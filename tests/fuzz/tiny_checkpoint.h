// A tiny run's state and its checkpoints, for the checkpoint fuzz targets and make_seeds: one
// part with a row-sharded matrix, a replicated vector and a manifest value, saved by one rank
// at steps 2 and 4 (each step's values distinct, so a load shows which step it read).
#pragma once

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint_manager.h"
#include "core/error.h"
#include "core/json_integer.h"
#include "core/stateful.h"
#include "core/tensor.h"

namespace frugal::fuzz {

class TinyState : public Stateful {
 public:
  Tensor weights = Tensor::zeros({5, 3});
  Tensor table = Tensor::zeros({4});
  int64_t seen = 0;

  // The values of step `step`.
  void set_step(int64_t step) {
    for (int64_t i = 0; i < weights.numel(); ++i) weights.data<float>()[i] = float(step * 100 + i);
    for (int64_t i = 0; i < table.numel(); ++i) table.data<float>()[i] = float(-step - i) / 8;
    seen = step * 7;
  }
  // Whether the values are step `step`'s.
  bool holds_step(int64_t step) const {
    TinyState expected;
    expected.set_step(step);
    for (int64_t i = 0; i < weights.numel(); ++i)
      if (weights.data<float>()[i] != expected.weights.data<float>()[i]) return false;
    for (int64_t i = 0; i < table.numel(); ++i)
      if (table.data<float>()[i] != expected.table.data<float>()[i]) return false;
    return seen == expected.seen;
  }

  std::vector<StateTensor> state_tensors() override {
    return {{"model/weights", weights, whole_rows(weights.shape(), false)},
            {"optim/table", table, whole_rows(table.shape(), true)}};
  }
  nlohmann::json state_values() const override { return {{"seen", seen}}; }
  void load_state_values(const nlohmann::json& values) override {
    seen = json_integer(values.at("seen"), "'seen'", 0);
  }
};

// `check_time_limit_s`: how long a rank file's check may take (0: frugal's default).
inline CheckpointManager tiny_manager(const std::string& root, TinyState& state,
                                      double check_time_limit_s = 0) {
  CheckpointDir dir(root);
  dir.set_check_time_limit(check_time_limit_s);
  return CheckpointManager(
      std::move(dir), /*rank=*/0, /*world_size=*/1, [](bool ok) { return ok; }, {{"tiny", &state}},
      /*keep=*/10);
}

// Steps 2 and 4 under `root`, committed.
inline void save_tiny_checkpoints(const std::string& root) {
  TinyState state;
  CheckpointManager manager = tiny_manager(root, state);
  for (int64_t step : {2, 4}) {
    state.set_step(step);
    manager.save(step);
  }
}

}  // namespace frugal::fuzz
