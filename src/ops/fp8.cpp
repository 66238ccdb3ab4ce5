// FP8 operations: shape checks, the CPU implementations over kernels/cpu/fp8, and the dispatch
// of GPU tensors to ops/gpu_ops.cpp.
#include "ops/fp8.h"

#include <bit>
#include <vector>

#include "kernels/cpu/linear.h"
#include "ops/gpu_ops.h"
#include "ops/ops.h"

namespace frugal::ops {

namespace {

#ifdef FRUGAL_HAVE_CUDA
bool on_gpu(const Tensor& t) { return t.defined() && t.device() == Device::cuda; }
#endif

void expect_slot(const Fp8Slot& s, const Tensor& like) {
  FRUGAL_CHECK(s.scale.defined() && s.scale_inv.defined() && s.amax.defined() && s.counts.defined(),
               "fp8 cast with an incomplete scaling slot");
  FRUGAL_CHECK(s.scale.device() == like.device(), "fp8 scaling state on another device than ",
               "the tensor cast");
}

// The values of an operand as f32 [rows, k] (the CPU's GEMM reads these).
std::vector<float> dequantized(const Fp8Matrix& m) {
  std::vector<float> out(static_cast<size_t>(m.codes.numel()));
  cpu::fp8_dequantize(out.data(), m.codes.data<uint8_t>(), m.codes.numel(), m.format,
                      m.scale_inv.data<float>()[0]);
  return out;
}

void expect_operands(const Fp8Matrix& a, const Fp8Matrix& b) {
  FRUGAL_CHECK(a.codes.defined() && b.codes.defined() && a.codes.ndim() == 2 &&
                   b.codes.ndim() == 2 && a.codes.size(1) == b.codes.size(1),
               "fp8 gemm of ", a.codes.defined() ? shape_string(a.codes.shape()) : "undefined",
               " and ", b.codes.defined() ? shape_string(b.codes.shape()) : "undefined",
               ": expected [m, k] and [n, k]");
  FRUGAL_CHECK(a.codes.device() == b.codes.device(), "fp8 gemm operands on two devices");
}

}  // namespace

Fp8Cast fp8_cast(const Tensor& x, const Fp8Slot& slot, bool plain, bool transposed) {
  FRUGAL_CHECK(x.ndim() == 2, "fp8 cast of a ", x.ndim(), "-d tensor, expected [rows, cols]");
  expect_slot(slot, x);
#ifdef FRUGAL_HAVE_CUDA
  if (on_gpu(x)) return gpu::fp8_cast(x, slot, plain, transposed);
#endif
  FRUGAL_CHECK(x.dtype() == DType::f32, "fp8 cast of a CPU tensor of dtype ", dtype_name(x.dtype()),
               ", expected f32");
  const int64_t rows = x.size(0), cols = x.size(1);
  Fp8Cast out;
  out.plain = {Tensor(), slot.scale_inv, slot.format};
  out.transposed = {Tensor(), slot.scale_inv, slot.format};
  if (plain) out.plain.codes = Tensor::empty({rows, cols}, DType::u8, host_arena());
  if (transposed) out.transposed.codes = Tensor::empty({cols, rows}, DType::u8, host_arena());
  float& scale = slot.scale.data<float>()[0];
  float& amax = slot.amax.data<float>()[0];
  if (slot.current) {
    amax = cpu::fp8_amax(x.data<float>(), x.numel());
    scale = cpu::fp8_scale_from_amax(amax, scale, cpu::fp8_max(slot.format), slot.margin);
    slot.scale_inv.data<float>()[0] = 1.0f / scale;
  }
  cpu::Fp8CastCounts counts;
  const float seen =
      cpu::fp8_cast_transpose(x.data<float>(), rows, cols, scale, slot.format,
                              plain ? out.plain.codes.data<uint8_t>() : nullptr,
                              transposed ? out.transposed.codes.data<uint8_t>() : nullptr, &counts);
  // amax as the GPU keeps it: the larger bit pattern (a NaN wins).
  if (!slot.current && std::bit_cast<uint32_t>(seen) > std::bit_cast<uint32_t>(amax)) amax = seen;
  int64_t* c = slot.counts.data<int64_t>();
  c[0] += counts.values;
  c[1] += counts.flushed;
  c[2] += counts.saturated;
  return out;
}

namespace {

void dequantize(Tensor& values, const Nf4Parts& w) {
  dequantize_nf4(values, w.codes, w.absmax_codes, w.scales, w.offset, w.nf4_table, w.absmax_map);
}
void dequantize(Tensor& values, const HqqParts& w) {
  dequantize_hqq(values, w.codes, w.scales, w.zeros);
}

// A GPU casts from the 4-bit codes; the CPU, the reference, casts the f32 dequantization.
template <class Parts>
Fp8Cast cast_four_bit(const Parts& w, int64_t rows, int64_t cols, const Fp8Slot& slot, bool plain,
                      bool transposed) {
  FRUGAL_CHECK(
      rows > 0 && cols > 0 && w.codes.dtype() == DType::u8 && w.codes.numel() * 2 >= rows * cols,
      "fp8 cast of a 4-bit weight [", rows, ", ", cols, "] from ", w.codes.numel(), " code bytes");
  expect_slot(slot, w.codes);
#ifdef FRUGAL_HAVE_CUDA
  if (on_gpu(w.codes)) return gpu::fp8_cast(w, rows, cols, slot, plain, transposed);
#endif
  Tensor values = Tensor::empty({rows, cols}, DType::f32, host_arena());
  dequantize(values, w);
  return fp8_cast(values, slot, plain, transposed);
}

}  // namespace

Fp8Cast fp8_cast(const Nf4Parts& w, int64_t rows, int64_t cols, const Fp8Slot& slot, bool plain,
                 bool transposed) {
  return cast_four_bit(w, rows, cols, slot, plain, transposed);
}

Fp8Cast fp8_cast(const HqqParts& w, int64_t rows, int64_t cols, const Fp8Slot& slot, bool plain,
                 bool transposed) {
  return cast_four_bit(w, rows, cols, slot, plain, transposed);
}

Tensor fp8_gemm(const Fp8Matrix& a, const Fp8Matrix& b, bool fast_accumulation) {
  expect_operands(a, b);
#ifdef FRUGAL_HAVE_CUDA
  if (on_gpu(a.codes)) return gpu::fp8_gemm(a, b, fast_accumulation);
#endif
  const int64_t m = a.codes.size(0), n = b.codes.size(0), k = a.codes.size(1);
  Tensor out = Tensor::empty({m, n}, DType::f32, host_arena());
  const std::vector<float> av = dequantized(a), bv = dequantized(b);
  cpu::linear_forward(out.data<float>(), av.data(), bv.data(), m, n, k);
  return out;
}

void fp8_gemm_accumulate(Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b,
                         bool fast_accumulation) {
  expect_operands(a, b);
  const int64_t m = a.codes.size(0), n = b.codes.size(0);
  FRUGAL_CHECK(out.shape() == Shape({m, n}) && out.dtype() == DType::f32,
               "fp8 gemm accumulating into ", shape_string(out.shape()), " ",
               dtype_name(out.dtype()), ", expected [", m, ", ", n, "] f32");
#ifdef FRUGAL_HAVE_CUDA
  if (on_gpu(a.codes)) return gpu::fp8_gemm_accumulate(out, a, b, fast_accumulation);
#endif
  add_inplace(out, fp8_gemm(a, b, fast_accumulation));
}

void dequantize_fp8(Tensor& out, const Tensor& codes, const Tensor& scale_inv, Fp8Format format) {
  FRUGAL_CHECK(codes.numel() == out.numel() && codes.dtype() == DType::u8 && scale_inv.numel() == 1,
               "fp8 dequantize of ", codes.numel(), " codes into ", out.numel(), " values");
#ifdef FRUGAL_HAVE_CUDA
  if (on_gpu(out)) return gpu::dequantize_fp8(out, codes, scale_inv, format);
#endif
  FRUGAL_CHECK(out.dtype() == DType::f32, "fp8 dequantize into ", dtype_name(out.dtype()),
               " on the CPU, expected f32");
  cpu::fp8_dequantize(out.data<float>(), codes.data<uint8_t>(), out.numel(), format,
                      scale_inv.data<float>()[0]);
}

Fp8Matrix fp8_transposed(const Fp8Matrix& m) {
  FRUGAL_CHECK(m.codes.defined() && m.codes.ndim() == 2 && m.codes.dtype() == DType::u8,
               "fp8 transpose of ", m.codes.defined() ? shape_string(m.codes.shape()) : "undefined",
               " codes: expected u8 [rows, cols]");
  Fp8Matrix out{Tensor(), m.scale_inv, m.format};
#ifdef FRUGAL_HAVE_CUDA
  if (on_gpu(m.codes)) {
    out.codes = gpu::fp8_transpose_codes(m.codes);
    return out;
  }
#endif
  const int64_t rows = m.codes.size(0), cols = m.codes.size(1);
  out.codes = Tensor::empty({cols, rows}, DType::u8, host_arena());
  cpu::fp8_transpose_codes(out.codes.data<uint8_t>(), m.codes.data<uint8_t>(), rows, cols);
  return out;
}

void fp8_delayed_update(Tensor& history, Tensor& scale, Tensor& scale_inv, const Tensor& max_values,
                        int margin) {
  const int64_t slots = scale.numel();
  FRUGAL_CHECK(history.ndim() == 2 && history.size(1) == slots && scale_inv.numel() == slots &&
                   max_values.numel() == slots,
               "fp8 delayed update of history ", shape_string(history.shape()), " with ", slots,
               " scales");
#ifdef FRUGAL_HAVE_CUDA
  if (on_gpu(history))
    return gpu::fp8_delayed_update(history, scale, scale_inv, max_values, margin);
#endif
  cpu::fp8_delayed_update(history.data<float>(), scale.data<float>(), scale_inv.data<float>(),
                          max_values.data<float>(), history.size(0), slots, margin);
}

}  // namespace frugal::ops
