// FP8 rows of a frozen weight under ZeRO-3 (a LoRA base with [fp8] on): E4M3 codes with one
// scale for the whole tensor, so a gather moves one byte per weight, half of bf16's.
#pragma once

#include "parallel/weight_encoding.h"

namespace frugal {

// Parts: the codes (u8, one per weight) by rows, and the inverse scale (f32 [1]) replicated.
// Encoding agrees on the tensor's amax over every rank's rows (one all-reduce of a scalar), so
// each rank's codes are those a cast of the whole tensor makes: scale = 448 / amax, round to
// nearest even, as the FP8 GEMM's current scaling casts it (ops::fp8_cast).
class Fp8Encoding : public WeightEncoding {
 public:
  void encode(const ShardLayout& l, const Tensor& rows, const EncodingContext& context) override;
  std::vector<EncodedPart> parts() const override;
  void decode(const std::vector<Tensor>& whole, Tensor& out) const override;

 private:
  Tensor codes_;      // u8 [shard_rows * row_len]
  Tensor scale_inv_;  // f32 [1]
};

}  // namespace frugal
