// FP8 rows of a frozen weight under ZeRO-3; see fp8_encoding.h.
#include "parallel/fp8_encoding.h"

#include <bit>
#include <cmath>

#include "core/error.h"
#include "ops/fp8.h"
#include "ops/ops.h"

namespace frugal {

void Fp8Encoding::encode(const ShardLayout& l, const Tensor& rows, const EncodingContext& context) {
  const int rank = context.comm.rank();
  const int64_t real = (l.last_row(rank) - l.first_row(rank)) * l.row_len;
  const float* x = rows.data<float>();
  uint32_t amax_bits = 0;
  for (int64_t i = 0; i < real; ++i) {
    if (!std::isfinite(x[i]))
      fail("fp8: tensor '", l.name, "' holds ", x[i], " at element ",
           l.first_row(rank) * l.row_len + i, ": it cannot be stored in FP8");
    amax_bits = std::max(amax_bits, std::bit_cast<uint32_t>(std::fabs(x[i])));
  }
  // Non-negative floats order as their bit patterns: the ranks' max of the bits is the amax.
  amax_bits = static_cast<uint32_t>(context.comm.all_reduce_max(int64_t(amax_bits)));
  const float amax = std::bit_cast<float>(amax_bits);

  ops::Fp8Slot slot;
  slot.format = ops::Fp8Format::e4m3;
  slot.scale = Tensor::empty({1});
  slot.scale_inv = Tensor::empty({1});
  slot.amax = Tensor::zeros({1});
  slot.counts = Tensor::zeros({3}, DType::i64);
  slot.scale.data<float>()[0] = ops::fp8_scale_from_amax(amax, 1.0f, ops::fp8_max(slot.format), 0);
  slot.scale_inv.data<float>()[0] = 1.0f / slot.scale.data<float>()[0];
  // The padding rows are zeros: code 0.
  const ops::Fp8Cast cast = ops::fp8_cast(rows.view({l.shard_rows, l.row_len}), slot, true, false);
  codes_ =
      ops::convert(cast.plain.codes.view({l.shard_rows * l.row_len}), DType::u8, context.store);
  scale_inv_ = ops::convert(slot.scale_inv, DType::f32, context.store);
}

std::vector<EncodedPart> Fp8Encoding::parts() const {
  return {{codes_, PartSplit::rows}, {scale_inv_, PartSplit::replicated}};
}

void Fp8Encoding::decode(const std::vector<Tensor>& whole, Tensor& out) const {
  FRUGAL_CHECK(whole.size() == 2, "fp8 decode of ", whole.size(), " parts (codes, scale)");
  // The gathered codes end with the padding rows: the real ones come first.
  ops::dequantize_fp8(out, whole[0].rows(0, out.numel()), whole[1], ops::Fp8Format::e4m3);
}

}  // namespace frugal
