// What a part of a training run hands to the checkpoint manager: its named tensors, each this
// rank's rows of a whole tensor or a replicated whole, and its small values. The manager saves
// and loads them without knowing what they are (weights, AdamW moments, GaLore projectors,
// FP8 scales, a data cursor): a new stateful part needs no new checkpoint code.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace frugal {

// The rows a rank holds of a whole tensor: [first_row, last_row) of `full_shape`, in a
// buffer of `ceil(rows / ranks)` rows (ZeRO-3's padded row shards; the rows past
// last_row - first_row are padding). A replicated tensor is every row on every rank.
struct RowShard {
  Shape full_shape;
  int64_t first_row = 0, last_row = 0;
  bool replicated = false;  // every rank holds the same whole tensor (saved once, by rank 0)

  int64_t rows() const { return full_shape.empty() ? 1 : full_shape[0]; }
};
RowShard whole_rows(const Shape& full_shape, bool replicated);  // rows [0, rows)

struct StateTensor {
  std::string name;  // the dataset's name in the rank file, e.g. "optim/exp_avg/<hf name>"
  Tensor tensor;     // the live storage (any device and float dtype); loads assign into it
  RowShard rows;
};

class Stateful {
 public:
  virtual ~Stateful() = default;
  // The tensors to save, and the ones a load fills (the same list).
  virtual std::vector<StateTensor> state_tensors() { return {}; }
  // Small values saved in the manifest under the part's name, and checked or restored from it
  // on load (an Error there makes the checkpoint unusable, and resume tries an older one).
  virtual nlohmann::json state_values() const { return nullptr; }
  virtual void load_state_values(const nlohmann::json& /*values*/) {}
  // Before state_tensors() are read for a save (e.g. wait for background updates), and after
  // a load filled them (e.g. rebuild the bf16 copies of the master weights).
  virtual void before_save() {}
  virtual void after_load() {}
};

inline RowShard whole_rows(const Shape& full_shape, bool replicated) {
  RowShard r;
  r.full_shape = full_shape;
  r.last_row = r.rows();
  r.replicated = replicated;
  return r;
}

}  // namespace frugal
