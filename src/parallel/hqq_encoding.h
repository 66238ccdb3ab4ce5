// HQQ 4-bit rows of a frozen weight under ZeRO-3 (quant/hqq.h): every group is row-local, so a
// rank quantizes its own rows; only the early stop looks at the whole matrix's error.
#pragma once

#include "parallel/weight_encoding.h"

namespace frugal {

// Parts, all by rows: codes (u8, two per byte), scales and zeros (f32, one per group of 64).
// Encoding all-reduces the error of every iteration, so every rank stops where one process
// holding the whole matrix would.
class HqqEncoding : public WeightEncoding {
 public:
  void encode(const ShardLayout& l, const Tensor& rows, const EncodingContext& context) override;
  std::vector<EncodedPart> parts() const override;
  void decode(const std::vector<Tensor>& whole, Tensor& out) const override;
  std::optional<ops::Fp8Cast> decode_fp8(const std::vector<Tensor>& whole, int64_t rows,
                                         int64_t cols, const ops::Fp8Slot& slot, bool plain,
                                         bool transposed) const override;

 private:
  Tensor codes_;   // u8 [shard_rows * row_len / 2]
  Tensor scales_;  // f32 [shard_rows * row_len / 64]
  Tensor zeros_;   // f32 [shard_rows * row_len / 64]
};

}  // namespace frugal
