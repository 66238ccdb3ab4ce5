// NF4 rows of a frozen weight under ZeRO-3: the first level on this rank's blocks, the second
// over every rank's absmax.
#include "parallel/nf4_encoding.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"
#include "quant/nf4.h"

namespace frugal {

namespace {

void check_nf4_rows(const ShardLayout& l) {
  if (l.shape.size() != 2 || l.row_len % kNf4BlockSize != 0)
    fail("nf4: tensor '", l.name, "' of shape ", shape_string(l.shape),
         " cannot be stored in NF4: its rows must be a multiple of ", kNf4BlockSize, " long");
}

// Values of one slice of rows made on a GPU at a time: 256 MB of fp32.
constexpr int64_t kSeededSliceValues = int64_t{1} << 26;

}  // namespace

void Nf4Encoding::encode(const ShardLayout& l, const Tensor& rows, const EncodingContext& context) {
  check_nf4_rows(l);
  const int64_t per_row = l.row_len / kNf4BlockSize;
  const int64_t mine =
      (l.last_row(context.comm.rank()) - l.first_row(context.comm.rank())) * per_row;
  // First level, on this rank's rows.
  Tensor codes = Tensor::zeros({l.shard_rows * l.row_len / 2}, DType::u8);
  Tensor absmax = Tensor::zeros({l.shard_rows * per_row}, DType::f32);
  nf4_quantize_blocks(rows.data<float>(), mine, l.row_len, codes.data<uint8_t>(),
                      absmax.data<float>(), l.name);
  encode_levels(l, codes, absmax, context);
}

bool Nf4Encoding::encode_seeded(const ShardLayout& l, const SeededRows& seeded,
                                const EncodingContext& context) {
  Arena& gpu = context.transfer;
  if (gpu.device() == Device::cpu) return false;  // the host path is the same arithmetic
  check_nf4_rows(l);
  const int rank = context.comm.rank();
  const int64_t first = l.first_row(rank), mine_rows = l.last_row(rank) - first;
  const int64_t per_row = l.row_len / kNf4BlockSize;
  Tensor codes = ops::zeros({l.shard_rows * l.row_len / 2}, DType::u8, gpu);
  Tensor absmax = ops::zeros({l.shard_rows * per_row}, DType::f32, gpu);
  const int64_t slice_rows =
      std::max<int64_t>(1, std::min(mine_rows, kSeededSliceValues / l.row_len));
  if (mine_rows > 0) {
    Tensor slice = Tensor::empty({slice_rows, l.row_len}, DType::f32, gpu);
    for (int64_t r = 0; r < mine_rows; r += slice_rows) {
      const int64_t n = std::min(slice_rows, mine_rows - r);
      Tensor rows = slice.rows(0, n);
      ops::normal_rows(rows, seeded.key, first + r, seeded.std);
      Tensor slice_codes = codes.rows(r * l.row_len / 2, (r + n) * l.row_len / 2);
      Tensor slice_absmax = absmax.rows(r * per_row, (r + n) * per_row);
      const int64_t bad = ops::nf4_first_level(rows, n * per_row, slice_codes, slice_absmax,
                                               nf4_midpoints().data());
      if (bad < n * per_row) fail_nf4_non_finite(l.name, r * per_row + bad, l.row_len);
    }
  }
  encode_levels(l, codes, absmax, context);
  return true;
}

void Nf4Encoding::encode_levels(const ShardLayout& l, const Tensor& codes, const Tensor& absmax,
                                const EncodingContext& context) {
  const int rank = context.comm.rank();
  const int64_t per_row = l.row_len / kNf4BlockSize;
  const int64_t mine = (l.last_row(rank) - l.first_row(rank)) * per_row;
  // Every rank's absmax (one float per 64 weights), in the memory the communicator moves.
  Tensor all;
  if (context.comm.size() > 1) {
    Tensor local = ops::convert(absmax, DType::f32, context.transfer);
    Tensor gathered = Tensor::empty({l.rows_padded * per_row}, DType::f32, context.transfer);
    context.comm.all_gather(local, gathered)->wait_host();
    all = ops::to_host_f32(gathered);
  } else {
    all = ops::to_host_f32(absmax);
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

std::optional<ops::Fp8Cast> Nf4Encoding::decode_fp8(const std::vector<Tensor>& whole, int64_t rows,
                                                    int64_t cols, const ops::Fp8Slot& slot,
                                                    bool plain, bool transposed) const {
  FRUGAL_CHECK(whole.size() == 3, "nf4 decode of ", whole.size(),
               " parts (codes, absmax codes, scales)");
  const ops::Nf4Parts parts{
      whole[0], whole[1], whole[2], offset_, nf4_values().data(), dynamic_map_values().data()};
  return ops::fp8_cast(parts, rows, cols, slot, plain, transposed);
}

}  // namespace frugal
