// FP8 operations: per-tensor scaled casts that also write the transposed copy cuBLASLt's FP8
// GEMMs need (they take only the TN layout: both operands contiguous along the reduced
// dimension), the scaled GEMM, and delayed scaling's step-end update. Scales, amaxes and counts
// stay on the tensors' device: nothing here waits for the GPU.
#pragma once

#include "core/tensor.h"
#include "kernels/cpu/fp8.h"

namespace frugal::ops {

using cpu::fp8_max;  // the largest finite value of a format
using cpu::fp8_scale_from_amax;
using cpu::Fp8Format;

// Where one tensor's casts find their scale and leave what they saw: views of one slot of the
// model's FP8 state (model/fp8_scaling.h), on the device of the tensors cast.
struct Fp8Slot {
  Fp8Format format = Fp8Format::e4m3;
  Tensor scale, scale_inv;  // f32 [1]
  Tensor amax;           // f32 [1]: delayed: raised to max |x| by each cast; current: this cast's
  Tensor counts;         // i64 [3]: values cast, flushed to zero, saturated (added to)
  bool current = false;  // current scaling: the scale comes from this tensor's own amax
  int margin = 0;        // scale = max / amax * 2^-margin
};

// One operand of an FP8 GEMM: codes [rows, k], contiguous along k, and the inverse scale that
// takes them back to the tensor's values.
struct Fp8Matrix {
  Tensor codes;      // u8
  Tensor scale_inv;  // f32 [1]
  Fp8Format format = Fp8Format::e4m3;
};

struct Fp8Cast {
  Fp8Matrix plain;       // [rows, cols] (undefined codes unless asked for)
  Fp8Matrix transposed;  // [cols, rows]
};

// x [rows, cols] in the compute dtype -> the codes of x * scale, as asked: plain and/or
// transposed, in one pass over x. Delayed scaling reads slot.scale and raises slot.amax;
// current scaling first sets slot.amax = max |x| (one more read of x) and the scale from it.
// On a GPU rows and cols must be multiples of 16 (cuBLASLt's FP8 layouts).
Fp8Cast fp8_cast(const Tensor& x, const Fp8Slot& slot, bool plain, bool transposed);

// A frozen 4-bit weight of n values as stored, its tensors on one device: ops.h's
// dequantize_nf4 / dequantize_hqq inputs (quant/nf4.h's and quant/hqq.h's formats).
struct Nf4Parts {
  Tensor codes, absmax_codes, scales;  // u8 [n / 2], u8 [n / 64], f32 [ceil(n / 64 / 256)]
  float offset = 0;
  const float* nf4_table = nullptr;   // nf4_values()
  const float* absmax_map = nullptr;  // dynamic_map_values()
};
struct HqqParts {
  Tensor codes, scales, zeros;  // u8 [n / 2], f32 [n / 64] each
};

// The cast of a 4-bit weight [rows, cols]: fp8_cast of its dequantization into the compute dtype
// (dequantize_nf4 / dequantize_hqq), bit for bit (codes, amax, counts), without that copy: a GPU
// reads the 4-bit codes and writes FP8 codes in one pass (QLoRA's frozen base straight into an
// FP8 GEMM). The CPU, the reference, dequantizes and casts.
Fp8Cast fp8_cast(const Nf4Parts& w, int64_t rows, int64_t cols, const Fp8Slot& slot, bool plain,
                 bool transposed);
Fp8Cast fp8_cast(const HqqParts& w, int64_t rows, int64_t cols, const Fp8Slot& slot, bool plain,
                 bool transposed);

// a [m, k] . b [n, k]^T over the operands' values (codes times scale_inv), fp32 accumulation, in
// the compute dtype. fast_accumulation: the GPU may accumulate in its faster, less exact FP8
// mode (the forward's GEMM); the gradients' GEMMs keep it off.
Tensor fp8_gemm(const Fp8Matrix& a, const Fp8Matrix& b, bool fast_accumulation);
// out [m, n] (f32) += the same product: weight gradients, added over micro-batches.
void fp8_gemm_accumulate(Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b,
                         bool fast_accumulation);

// out = decode(codes) * scale_inv in out's dtype (f32 on the CPU, bf16 on a GPU): a weight
// gathered as FP8 (parallel/fp8_encoding.h). codes u8 of out's numel, scale_inv f32 [1], all on
// out's device.
void dequantize_fp8(Tensor& out, const Tensor& codes, const Tensor& scale_inv, Fp8Format format);

// The operand m^T: codes [k, rows] of the same values (same scale), for a weight whose codes
// came whole (gathered as FP8) and whose dgrad needs W^T.
Fp8Matrix fp8_transposed(const Fp8Matrix& m);

// Delayed scaling's step end on every slot at once (cpu::fp8_delayed_update): history f32
// [len, slots], scale, scale_inv and max_values f32 [slots], all on one device.
void fp8_delayed_update(Tensor& history, Tensor& scale, Tensor& scale_inv, const Tensor& max_values,
                        int margin);

}  // namespace frugal::ops
