// FP8 training's per-tensor scales: which block linears run through FP8 GEMMs, and the state of
// every tensor they cast (inputs and weights E4M3, output gradients E5M2) under a recipe:
// delayed scaling (TransformerEngine's DelayedScaling: the scale comes from the max of the last
// amax_history_len steps' amaxes, updated at the step's end) or current scaling (each cast
// takes its tensor's own amax first). The state lives on the model's device; the casts read and
// raise it there, so a step has no host round trip for scales.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/enum_names.h"
#include "core/stateful.h"
#include "core/tensor.h"
#include "model/llama_config.h"
#include "ops/fp8.h"

namespace frugal {

// fp8.recipe: scales from the amax history (TransformerEngine's DelayedScaling), or from each
// tensor's own amax at each cast (one more read of the tensor).
enum class Fp8Recipe : uint8_t { delayed, current };
inline std::span<const EnumName<Fp8Recipe>> enum_names(Fp8Recipe) {
  static constexpr EnumName<Fp8Recipe> names[] = {{Fp8Recipe::delayed, "delayed"},
                                                  {Fp8Recipe::current, "current"}};
  return names;
}

struct Fp8Settings {
  bool enabled = false;
  Fp8Recipe recipe = Fp8Recipe::delayed;
  int64_t amax_history_len = 16;
  int64_t margin = 0;
  std::vector<int> linears;  // BlockParam indices (lora.h's names); default: all seven
};

// What a cast tensor is, for the underflow/overflow report.
enum class Fp8Role : uint8_t { activation, weight, gradient };
inline std::span<const EnumName<Fp8Role>> enum_names(Fp8Role) {
  static constexpr EnumName<Fp8Role> names[] = {{Fp8Role::activation, "activation"},
                                                {Fp8Role::weight, "weight"},
                                                {Fp8Role::gradient, "gradient"}};
  return names;
}

// A block's cast tensors: 4 inputs (q, k, v share n1; gate and up share n2), 7 weights, 7 output
// gradients.
inline constexpr int kFp8SlotsPerBlock = 18;

class Fp8Scaling : public Stateful {
 public:
  // State for `layers` blocks in `memory` (the compute device's); every scale starts at 1.
  Fp8Scaling(const Fp8Settings& settings, int64_t layers, Arena& memory);

  const Fp8Settings& settings() const { return settings_; }
  // Whether block projection p (a BlockParam) goes through FP8.
  bool covers(int p) const;
  // The slots of projection p of a layer: its input (shared by the projections that read the
  // same tensor), its weight, its output gradient.
  ops::Fp8Slot input(int64_t layer, int p) const;
  ops::Fp8Slot weight(int64_t layer, int p) const;
  ops::Fp8Slot gradient(int64_t layer, int p) const;
  // Which input slot projection p reads (the same for q, k, v and for gate, up): a cast of that
  // input can serve every projection that reads it.
  static int input_index(int p);

  // The step's end. Delayed: this step's amaxes (one row of [slots]) reduced by
  // `all_reduce_max` (in place: the max over the ranks that share the tensors, the data-parallel
  // group) and the scales updated. Current: nothing to do.
  // `weights_all_reduce_max` (optional) then takes each layer's weight amaxes (one contiguous
  // range a layer), for the ranks that hold rows of the same weights (ZeRO-3's shard group,
  // which FP8 weight gathers cast a shard each on): their scales must be equal for the gathered
  // codes to be one tensor's.
  void end_step(const std::function<void(Tensor&)>& all_reduce_max,
                const std::function<void(Tensor&)>& weights_all_reduce_max = {});

  // Counts since the last call, per layer and role, and zeroed on the device (waits for it).
  struct Counts {
    int64_t layer = 0;
    Fp8Role role = Fp8Role::activation;
    int64_t values = 0, flushed = 0, saturated = 0;
  };
  std::vector<Counts> take_counts();

  // Stateful: the delayed recipe's history and scales (replicated; the same on every rank).
  std::vector<StateTensor> state_tensors() override;

 private:
  ops::Fp8Slot slot(int64_t index, ops::Fp8Format format) const;

  Fp8Settings settings_;
  std::array<bool, kBlockParamCount> covered_{};
  int64_t slots_ = 0;
  // A slot's entries are kSlotStride apart (fp8_scaling.cpp says why).
  Tensor history_;  // f32 [amax_history_len, slots * stride]; row 0: this step's amax
  Tensor scale_, scale_inv_, max_values_;  // f32 [slots * stride]
  Tensor counts_;                          // i64 [slots, 3]
};

}  // namespace frugal
