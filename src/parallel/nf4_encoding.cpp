// NF4 rows of a frozen weight under ZeRO-3: the first level on this rank's blocks, the second
// over every rank's absmax.
#include "parallel/nf4_encoding.h"

#include "core/error.h"
#include "ops/ops.h"
#include "quant/nf4.h"

namespace frugal {

void Nf4Encoding::encode(const ShardLayout& l, const Tensor& rows, const EncodingContext& context) {
  const int rank = context.comm.rank();
  if (l.shape.size() != 2 || l.row_len % kNf4BlockSize != 0)
    fail("nf4: tensor '", l.name, "' of shape ", shape_string(l.shape),
         " cannot be stored in NF4: its rows must be a multiple of ", kNf4BlockSize, " long");
  const int64_t per_row = l.row_len / kNf4BlockSize;
  const int64_t mine = (l.last_row(rank) - l.first_row(rank)) * per_row;
  // First level, on this rank's rows.
  Tensor codes = Tensor::zeros({l.shard_rows * l.row_len / 2}, DType::u8);
  Tensor absmax = Tensor::zeros({l.shard_rows * per_row}, DType::f32);
  nf4_quantize_blocks(rows.data<float>(), mine, l.row_len, codes.data<uint8_t>(),
                      absmax.data<float>(), l.name);
  // Every rank's absmax (one float per 64 weights), in the memory the communicator moves.
  Tensor all = absmax;
  if (context.comm.size() > 1) {
    Tensor local = ops::convert(absmax, DType::f32, context.transfer);
    Tensor gathered = Tensor::empty({l.rows_padded * per_row}, DType::f32, context.transfer);
    context.comm.all_gather(local, gathered)->wait_host();
    all = ops::to_host_f32(gathered);
  }
  // Second level over the real blocks (the padding rows come last), the same on every rank.
  const int64_t blocks = l.rows * per_row;
  Tensor absmax_codes = Tensor::empty({blocks}, DType::u8);
  Tensor scales =
      Tensor::empty({(blocks + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize}, DType::f32);
  nf4_double_quantize(all.data<float>(), blocks, absmax_codes.data<uint8_t>(), scales.data<float>(),
                      &offset_);
  Tensor my_codes = Tensor::zeros({l.shard_rows * per_row}, DType::u8);
  if (mine > 0)
    my_codes.rows(0, mine).copy_from(
        absmax_codes.rows(l.first_row(rank) * per_row, l.first_row(rank) * per_row + mine));
  codes_ = ops::convert(codes, DType::u8, context.store);
  absmax_codes_ = ops::convert(my_codes, DType::u8, context.store);
  scales_ = ops::convert(scales, DType::f32, context.store);
}

std::vector<EncodedPart> Nf4Encoding::parts() const {
  return {{codes_, PartSplit::rows},
          {absmax_codes_, PartSplit::rows},
          {scales_, PartSplit::replicated}};
}

void Nf4Encoding::decode(const std::vector<Tensor>& whole, Tensor& out) const {
  FRUGAL_CHECK(whole.size() == 3, "nf4 decode of ", whole.size(),
               " parts (codes, absmax codes, scales)");
  ops::dequantize_nf4(out, whole[0], whole[1], whole[2], offset_, nf4_values().data(),
                      dynamic_map_values().data());
}

}  // namespace frugal
