// HQQ 4-bit rows of a frozen weight under ZeRO-3: this rank's groups, the early stop decided by
// the ranks together.
#include "parallel/hqq_encoding.h"

#include "core/error.h"
#include "ops/ops.h"
#include "quant/hqq.h"

namespace frugal {

void HqqEncoding::encode(const ShardLayout& l, const Tensor& rows, const EncodingContext& context) {
  Comm& comm = context.comm;
  const int rank = comm.rank();
  if (l.shape.size() != 2 || l.row_len % kHqqGroupSize != 0)
    fail("hqq: tensor '", l.name, "' of shape ", shape_string(l.shape),
         " cannot be stored in HQQ: its rows must be a multiple of ", kHqqGroupSize, " long");
  // Every group is row-local; only the early stop looks at the whole matrix's error.
  const int64_t real = l.last_row(rank) - l.first_row(rank);
  HqqOptions options;
  if (comm.size() > 1)
    options.global_sum = [&comm](double local) { return comm.all_reduce_sum(local); };
  const HqqWeight q = hqq_quantize(rows.data<float>(), {real, l.row_len}, l.name, options);
  const int64_t per_row = l.row_len / kHqqGroupSize;
  Tensor codes = Tensor::zeros({l.shard_rows * l.row_len / 2}, DType::u8);
  Tensor scales = Tensor::zeros({l.shard_rows * per_row}, DType::f32);
  Tensor zeros = Tensor::zeros({l.shard_rows * per_row}, DType::f32);
  if (real > 0) {
    codes.rows(0, real * l.row_len / 2).copy_from(q.codes);
    scales.rows(0, real * per_row).copy_from(q.scales);
    zeros.rows(0, real * per_row).copy_from(q.zeros);
  }
  codes_ = ops::convert(codes, DType::u8, context.store);
  scales_ = ops::convert(scales, DType::f32, context.store);
  zeros_ = ops::convert(zeros, DType::f32, context.store);
}

std::vector<EncodedPart> HqqEncoding::parts() const {
  return {{codes_, PartSplit::rows}, {scales_, PartSplit::rows}, {zeros_, PartSplit::rows}};
}

void HqqEncoding::decode(const std::vector<Tensor>& whole, Tensor& out) const {
  FRUGAL_CHECK(whole.size() == 3, "hqq decode of ", whole.size(), " parts (codes, scales, zeros)");
  ops::dequantize_hqq(out, whole[0], whole[1], whole[2]);
}

std::optional<ops::Fp8Cast> HqqEncoding::decode_fp8(const std::vector<Tensor>& whole, int64_t rows,
                                                    int64_t cols, const ops::Fp8Slot& slot,
                                                    bool plain, bool transposed) const {
  FRUGAL_CHECK(whole.size() == 3, "hqq decode of ", whole.size(), " parts (codes, scales, zeros)");
  return ops::fp8_cast(ops::HqqParts{whole[0], whole[1], whole[2]}, rows, cols, slot, plain,
                       transposed);
}

}  // namespace frugal
