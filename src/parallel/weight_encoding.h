// How ZeRO-3 keeps a frozen weight in fewer bytes than its rows (NF4, HQQ; FP8 next): each rank
// encodes its own rows into parts, the ranks gather the parts, and the whole weight is decoded
// from them in the compute dtype only when a layer needs it.
//
// Here rather than in quant/: an encoding of a *row-sharded* weight decides which of its parts
// are split by rows (gathered) and which every rank holds whole, and its encoding may be a
// collective (NF4's second level needs every block's absmax; HQQ's early stop the whole
// matrix's error). quant/ keeps the arithmetic on blocks and groups (nf4_quantize_blocks,
// hqq_quantize, ...) and knows nothing of ranks; the decoders are ops (ops::dequantize_*).
//
// The weights ZeRO-3 trains are not encoded: their bf16 copies (GPU) or fp32 shards (CPU) are
// gathered as they are, straight into the buffer the layers read (or, for FP8 training's
// linears, cast to E4M3 with their delayed scale before each gather: Zero3Init::fp8_gather). An
// encoding is a one-time transform of a weight that never changes, decoded into a buffer of its
// own; the trainable weights change every step, their copies are kept by the optimizer and moved by
// the placement (zero3_placement.h), and they need no decode pass.
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"
#include "ops/fp8.h"
#include "parallel/comm.h"
#include "parallel/shard_layout.h"

namespace frugal {

// How a part of an encoded weight is split over the ranks.
enum class PartSplit {
  rows,        // this rank holds the part of its own rows; the ranks' parts are gathered in
               // rank order (as the weight's rows are)
  replicated,  // every rank holds the whole part (the same on every rank); used as it is
};

struct EncodedPart {
  Tensor data;  // in the store arena that encode was given; any dtype (moved verbatim)
  PartSplit split = PartSplit::rows;
};

// What encode needs besides the rows.
struct EncodingContext {
  Comm& comm;       // the ranks the weight's rows are split over
  Arena& transfer;  // memory the communicator moves (a GPU's with NCCL), for encode's collectives
  Arena& store;     // where the parts are kept (where the gathers read them, or upload them from)
};

// The rows of a weight no file gives: drawn from normal(0, std) by the streams of `key`
// (init_row_key; ops::normal_rows makes them on either device).
struct SeededRows {
  uint64_t key = 0;
  float std = 0;
};

// One frozen weight in an encoding: this rank's encoded rows, and the decoder of the whole.
// Each encoding is a class of its own (Nf4Encoding, HqqEncoding); ZeRO-3 holds one object per
// encoded weight and knows only this interface. Fp8Encoding (a frozen LoRA base in E4M3) is one
// more: its rows as E4M3 bytes with a per-tensor scale (the ranks agree on the absmax), the bytes
// a row-sharded part, decoded as bytes times scale into the compute dtype.
class WeightEncoding {
 public:
  virtual ~WeightEncoding() = default;

  // Encodes this rank's rows of the weight laid out as `l`: rows is f32 in host memory,
  // [l.shard_rows, ...], its real rows (l.first_row(rank) ..) first and zeros after. A collective
  // where the encoding needs one: every rank calls it for the same weights in the same order.
  // Throws an Error naming the weight where it cannot be encoded (shape, inf or NaN). Called
  // once, before parts() and decode().
  virtual void encode(const ShardLayout& l, const Tensor& rows, const EncodingContext& context) = 0;
  // Encodes this rank's rows of a weight that comes from the seed, making them where the
  // encoding works fastest (a GPU: context.transfer's device) instead of in host memory; the
  // same parts as encode of the host's rows, bit for bit. Returns false where it has no such
  // path (the caller then makes the rows on the host and calls encode). A collective like encode.
  virtual bool encode_seeded(const ShardLayout& l, const SeededRows& seeded,
                             const EncodingContext& context) {
    (void)l, (void)seeded, (void)context;
    return false;
  }
  // The parts, in an order that decode relies on and that is the same on every rank.
  virtual std::vector<EncodedPart> parts() const = 0;
  // out (the real rows, [l.rows, ...], the compute dtype of its device) = the weight decoded from
  // `whole`: parts()'s tensors in parts()'s order on out's device, each row-sharded one gathered
  // from every rank (padding rows last), each replicated one as this rank holds it.
  virtual void decode(const std::vector<Tensor>& whole, Tensor& out) const = 0;
  // The FP8 cast of the decoded weight [rows, cols] (plain and/or transposed) from `whole` as
  // decode takes it: the codes, amax and counts of ops::fp8_cast of decode's output, bit for
  // bit, made without that copy in the compute dtype (a frozen 4-bit base straight into an FP8
  // GEMM). None where the encoding has no such path: the caller decodes and casts.
  virtual std::optional<ops::Fp8Cast> decode_fp8(const std::vector<Tensor>& whole, int64_t rows,
                                                 int64_t cols, const ops::Fp8Slot& slot, bool plain,
                                                 bool transposed) const {
    (void)whole, (void)rows, (void)cols, (void)slot, (void)plain, (void)transposed;
    return std::nullopt;
  }
};

}  // namespace frugal
