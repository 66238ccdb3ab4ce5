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
  // On a GPU: the rows made and quantized there a slice at a time (ops::normal_rows,
  // ops::nf4_first_level), only the codes and the absmax coming to the host.
  bool encode_seeded(const ShardLayout& l, const SeededRows& seeded,
                     const EncodingContext& context) override;
  std::vector<EncodedPart> parts() const override;
  void decode(const std::vector<Tensor>& whole, Tensor& out) const override;
  std::optional<ops::Fp8Cast> decode_fp8(const std::vector<Tensor>& whole, int64_t rows,
                                         int64_t cols, const ops::Fp8Slot& slot, bool plain,
                                         bool transposed) const override;

 private:
  // The second level from this rank's first (codes [shard_rows * row_len / 2] and absmax
  // [shard_rows * row_len / 64], on any device, zeros past its real rows), and the parts kept.
  void encode_levels(const ShardLayout& l, const Tensor& codes, const Tensor& absmax,
                     const EncodingContext& context);

  Tensor codes_;         // u8 [shard_rows * row_len / 2]
  Tensor absmax_codes_;  // u8 [shard_rows * row_len / 64]
  Tensor scales_;        // f32 [ceil(rows * row_len / 64 / 256)], the whole tensor's
  float offset_ = 0;
};

}  // namespace frugal
