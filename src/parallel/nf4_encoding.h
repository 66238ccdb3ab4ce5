// NF4 rows of a frozen weight under ZeRO-3 (QLoRA's base): quantized exactly as bitsandbytes
// quantizes the whole tensor (quant/nf4.h), though each rank holds only its own rows.
#pragma once

#include "parallel/weight_encoding.h"

namespace frugal {

// Parts: codes (u8, two per byte) and absmax codes (u8, one per block of 64) by rows; the
// second-level scales (f32, one per 256 blocks of the whole tensor) replicated, with the offset
// (the mean absmax) a member. Encoding all-gathers the absmax: the second level spans every
// rank's blocks (a group of 256 may straddle two ranks' rows).
class Nf4Encoding : public WeightEncoding {
 public:
  void encode(const ShardLayout& l, const Tensor& rows, const EncodingContext& context) override;
  std::vector<EncodedPart> parts() const override;
  void decode(const std::vector<Tensor>& whole, Tensor& out) const override;

 private:
  Tensor codes_;         // u8 [shard_rows * row_len / 2]
  Tensor absmax_codes_;  // u8 [shard_rows * row_len / 64]
  Tensor scales_;        // f32 [ceil(rows * row_len / 64 / 256)], the whole tensor's
  float offset_ = 0;
};

}  // namespace frugal
