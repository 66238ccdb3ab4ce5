// FP8 scaling state of the block linears; see fp8_scaling.h.
#include "model/fp8_scaling.h"

#include <algorithm>

#include "ops/ops.h"

namespace frugal {

namespace {

// Ordinal of a projection among the seven (q, k, v, o, gate, up, down).
int projection_ordinal(int p) {
  switch (p) {
    case kQProj:
      return 0;
    case kKProj:
      return 1;
    case kVProj:
      return 2;
    case kOProj:
      return 3;
    case kGateProj:
      return 4;
    case kUpProj:
      return 5;
    case kDownProj:
      return 6;
  }
  fail("block parameter ", p, " is not a projection");
}

constexpr int kInputSlots = 4, kWeightSlots = 7;

// Each slot's scale, inverse scale and amax sit 64 bytes apart (one f32 used in 16): cuBLASLt
// reads the inverse scales through pointers, and refuses (CUBLAS_STATUS_NOT_SUPPORTED, seen on
// the H200) one at a 4-byte offset. The unused entries never see a cast: their amax stays 0, so
// the delayed update keeps their scale at 1.
constexpr int64_t kSlotStride = 16;

// A host f32 [n] filled with v, moved to `memory`.
Tensor filled(int64_t n, float v, Arena& memory) {
  Tensor host = Tensor::empty({n}, DType::f32);
  std::fill_n(host.data<float>(), n, v);
  Tensor out = Tensor::empty({n}, DType::f32, memory);
  ops::copy(out, host);
  return out;
}

}  // namespace

int Fp8Scaling::input_index(int p) {
  switch (p) {
    case kQProj:
    case kKProj:
    case kVProj:
      return 0;
    case kOProj:
      return 1;
    case kGateProj:
    case kUpProj:
      return 2;
    case kDownProj:
      return 3;
  }
  fail("block parameter ", p, " is not a projection");
}

Fp8Scaling::Fp8Scaling(const Fp8Settings& settings, int64_t layers, Arena& memory)
    : settings_(settings), slots_(layers * kFp8SlotsPerBlock) {
  FRUGAL_CHECK(settings.amax_history_len >= 1, "fp8.amax_history_len ", settings.amax_history_len,
               " must be at least 1");
  for (int p : settings.linears) {
    projection_ordinal(p);
    covered_[size_t(p)] = true;
  }
  const int64_t stored = slots_ * kSlotStride;
  history_ = ops::zeros({settings.amax_history_len, stored}, DType::f32, memory);
  scale_ = filled(stored, 1.0f, memory);
  scale_inv_ = filled(stored, 1.0f, memory);
  Tensor max_host = Tensor::empty({stored}, DType::f32);
  for (int64_t s = 0; s < stored; ++s)
    max_host.data<float>()[s] = ops::fp8_max(
        (s / kSlotStride) % kFp8SlotsPerBlock < kInputSlots + kWeightSlots ? ops::Fp8Format::e4m3
                                                                           : ops::Fp8Format::e5m2);
  max_values_ = Tensor::empty({stored}, DType::f32, memory);
  ops::copy(max_values_, max_host);
  counts_ = ops::zeros({slots_ * 3}, DType::i64, memory);
}

bool Fp8Scaling::covers(int p) const {
  return p >= 0 && p < kBlockParamCount && covered_[size_t(p)];
}

ops::Fp8Slot Fp8Scaling::slot(int64_t index, ops::Fp8Format format) const {
  ops::Fp8Slot s;
  s.format = format;
  const int64_t at = index * kSlotStride;
  s.scale = scale_.rows(at, at + 1);
  s.scale_inv = scale_inv_.rows(at, at + 1);
  s.amax = history_.view({history_.numel()}).rows(at, at + 1);
  s.counts = counts_.rows(3 * index, 3 * index + 3);
  s.current = settings_.recipe == Fp8Recipe::current;
  s.margin = static_cast<int>(settings_.margin);
  return s;
}

ops::Fp8Slot Fp8Scaling::input(int64_t layer, int p) const {
  return slot(layer * kFp8SlotsPerBlock + input_index(p), ops::Fp8Format::e4m3);
}
ops::Fp8Slot Fp8Scaling::weight(int64_t layer, int p) const {
  return slot(layer * kFp8SlotsPerBlock + kInputSlots + projection_ordinal(p),
              ops::Fp8Format::e4m3);
}
ops::Fp8Slot Fp8Scaling::gradient(int64_t layer, int p) const {
  return slot(layer * kFp8SlotsPerBlock + kInputSlots + kWeightSlots + projection_ordinal(p),
              ops::Fp8Format::e5m2);
}

void Fp8Scaling::end_step(const std::function<void(Tensor&)>& all_reduce_max,
                          const std::function<void(Tensor&)>& weights_all_reduce_max) {
  if (settings_.recipe != Fp8Recipe::delayed) return;
  Tensor current = history_.view({history_.numel()}).rows(0, slots_ * kSlotStride);
  if (all_reduce_max) all_reduce_max(current);
  if (weights_all_reduce_max)
    for (int64_t layer = 0; layer < slots_ / kFp8SlotsPerBlock; ++layer) {
      const int64_t first = (layer * kFp8SlotsPerBlock + kInputSlots) * kSlotStride;
      Tensor weights = current.rows(first, first + kWeightSlots * kSlotStride);
      weights_all_reduce_max(weights);
    }
  ops::fp8_delayed_update(history_, scale_, scale_inv_, max_values_,
                          static_cast<int>(settings_.margin));
}

std::vector<Fp8Scaling::Counts> Fp8Scaling::take_counts() {
  // The counts after every cast queued so far (a copy ordered after the compute stream's work,
  // waited for), then zeroed on the device.
  Tensor host = Tensor::empty({slots_ * 3}, DType::i64);
  ops::SideCopy copy(host, counts_);
  copy.done();
  ops::zero(counts_);
  const int64_t* c = host.data<int64_t>();
  std::vector<Counts> out;
  const int64_t layers = slots_ / kFp8SlotsPerBlock;
  for (int64_t layer = 0; layer < layers; ++layer)
    for (Fp8Role role : {Fp8Role::activation, Fp8Role::weight, Fp8Role::gradient}) {
      Counts sum;
      sum.layer = layer;
      sum.role = role;
      const int first = role == Fp8Role::activation ? 0
                        : role == Fp8Role::weight   ? kInputSlots
                                                    : kInputSlots + kWeightSlots;
      const int count = role == Fp8Role::activation ? kInputSlots : kWeightSlots;
      for (int i = first; i < first + count; ++i) {
        const int64_t s = layer * kFp8SlotsPerBlock + i;
        sum.values += c[3 * s];
        sum.flushed += c[3 * s + 1];
        sum.saturated += c[3 * s + 2];
      }
      out.push_back(sum);
    }
  return out;
}

std::vector<StateTensor> Fp8Scaling::state_tensors() {
  if (settings_.recipe != Fp8Recipe::delayed) return {};
  return {{"fp8/amax_history", history_, whole_rows(history_.shape(), true)},
          {"fp8/scale", scale_, whole_rows(scale_.shape(), true)},
          {"fp8/scale_inv", scale_inv_, whole_rows(scale_inv_.shape(), true)}};
}

}  // namespace frugal
