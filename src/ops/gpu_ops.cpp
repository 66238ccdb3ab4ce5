// ops/ on a GPU: each operation allocates its result in the bound device's memory and queues
// its kernel on the compute stream. Nothing here waits for the GPU except the reads of a value
// (read_loss, sum_squares, to_host_f32).
#include "ops/gpu_ops.h"

#ifdef FRUGAL_HAVE_CUDA

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>

#include "core/device.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/normal_init.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/adamw_int8.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_merge.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/galore.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/normal_init.h"
#include "kernels/cuda/quant.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"

namespace frugal::ops::gpu {

namespace {

// What the operations share on the bound GPU: the context (stream, memory), one cuBLASLt
// context (its workspace is used by one stream), and small device scratch.
struct BoundDevice {
  DeviceContext* context = nullptr;
  std::unique_ptr<cuda::GemmContext> gemm;
  Tensor norm_sum;         // 1 f64: sum_squares' result
  Tensor norm_scratch;     // cuda::kSumSquaresManyScratch f64
  Tensor target_error;     // 2 i32: cross_entropy's out-of-range target report
  int64_t loss_vocab = 0;  // vocabulary of the chunks since the last read_loss
};

BoundDevice& bound() {
  static BoundDevice device;
  return device;
}

BoundDevice& device() {
  BoundDevice& d = bound();
  FRUGAL_CHECK(d.context, "an operation on a GPU tensor, but no GPU is bound (ops::bind_device)");
  return d;
}

cudaStream_t stream() { return device().context->compute().handle(); }
cuda::GemmContext& gemm() { return *device().gemm; }

__nv_bfloat16* bf(const Tensor& t) { return static_cast<__nv_bfloat16*>(t.raw()); }
float* f32(const Tensor& t) { return static_cast<float*>(t.raw()); }
const uint8_t* u8(const Tensor& t) { return static_cast<const uint8_t*>(t.raw()); }

cuda::Nf4Device nf4_device(const Nf4Parts& w) {
  return {u8(w.codes), u8(w.absmax_codes), f32(w.scales), w.offset, w.nf4_table, w.absmax_map};
}
cuda::HqqDevice hqq_device(const HqqParts& w) { return {u8(w.codes), f32(w.scales), f32(w.zeros)}; }
int32_t* i32(const Tensor& t) { return static_cast<int32_t*>(t.raw()); }

void expect(const Tensor& t, DType dtype, const char* what) {
  FRUGAL_CHECK(t.defined(), what, " is undefined");
  FRUGAL_CHECK(t.device() == Device::cuda, what, " is in host memory, expected a GPU tensor");
  FRUGAL_CHECK(t.dtype() == dtype, what, " has dtype ", dtype_name(t.dtype()), ", expected ",
               dtype_name(dtype));
}

Tensor empty(const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, compute_arena());
}

}  // namespace

void bind(DeviceContext* context) {
  BoundDevice& d = bound();
  if (!context) {
    d = BoundDevice();
    return;
  }
  d.context = context;
  d.gemm = std::make_unique<cuda::GemmContext>();
  d.norm_sum = Tensor::empty({1}, DType::f64, context->device_memory());
  d.norm_scratch =
      Tensor::empty({cuda::kSumSquaresManyScratch}, DType::f64, context->device_memory());
  d.target_error = zeros({2}, DType::i32, context->device_memory());
}

Arena& compute_arena() { return device().context->device_memory(); }

// --- memory ---------------------------------------------------------------------------------

Tensor zeros(const Shape& shape, DType dtype, Arena& arena) {
  Tensor t = Tensor::empty(shape, dtype, arena);
  if (arena.device() == Device::cuda)
    fill_zero_async(t, device().context->compute());
  else
    t.fill_zero();
  return t;
}

void copy(Tensor& dst, const Tensor& src) { copy_async(dst, src, device().context->compute()); }

Tensor convert(const Tensor& src, DType dtype, Arena& arena) {
  Tensor out = Tensor::empty(src.shape(), dtype, arena);
  if (src.dtype() == dtype) {
    copy(out, src);
    return out;
  }
  FRUGAL_CHECK(src.device() == Device::cuda && arena.device() == Device::cuda,
               "dtype conversion of a tensor between host and GPU");
  convert_into(out, src);
  return out;
}

void convert_into(Tensor& dst, const Tensor& src) {
  if (src.dtype() == DType::f32 && dst.dtype() == DType::bf16)
    cuda::f32_to_bf16(bf(dst), f32(src), src.numel(), stream());
  else if (src.dtype() == DType::bf16 && dst.dtype() == DType::f32)
    cuda::bf16_to_f32(f32(dst), bf(src), src.numel(), stream());
  else
    fail("no GPU conversion from ", dtype_name(src.dtype()), " to ", dtype_name(dst.dtype()));
}

Tensor to_host_f32(const Tensor& src) {
  Tensor wide = src.dtype() == DType::bf16 && src.device() == Device::cuda
                    ? convert(src, DType::f32, compute_arena())
                    : src;
  return to_host(wide, device().context->compute());
}

void* copy_beside(Tensor& dst, const Tensor& src) {
  DeviceContext& c = *device().context;
  c.comm().wait(c.compute());
  copy_async(dst, src, c.comm());
  auto* event = new Event();
  event->record(c.comm());
  return event;
}

void event_wait(void* event) { device().context->compute().wait(*static_cast<Event*>(event)); }
void event_done(void* event) { static_cast<Event*>(event)->synchronize(); }
void event_release(void* event) { delete static_cast<Event*>(event); }

void call_on_comm_stream(std::function<void()> fn) {
  device().context->comm().call_when_reached(std::move(fn));
}

bool has_device() { return bound().context != nullptr; }

std::unique_ptr<Arena> pinned_host_arena(std::string name) {
  return std::make_unique<PinnedHostArena>(0, std::move(name));
}

// --- layers ---------------------------------------------------------------------------------

Tensor embedding(const Tensor& tokens, const Tensor& table) {
  expect(table, DType::bf16, "embedding table");
  expect(tokens, DType::i32, "token ids");
  Tensor out = empty({tokens.numel(), table.size(1)}, DType::bf16);
  cuda::embedding_forward(bf(out), i32(tokens), bf(table), tokens.numel(), table.size(0),
                          table.size(1), stream());
  return out;
}

void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  expect(dtable, DType::f32, "embedding gradient");
  expect(dout, DType::bf16, "embedding output gradient");
  Tensor scratch =
      empty({cuda::embedding_backward_scratch_ints(tokens.numel(), dtable.size(0))}, DType::i32);
  cuda::embedding_backward(f32(dtable), bf(dout), i32(tokens), tokens.numel(), dtable.size(0),
                           dtable.size(1), i32(scratch), stream());
}

Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor* rstd) {
  expect(x, DType::bf16, "rmsnorm input");
  expect(w, DType::bf16, "rmsnorm weight");
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  Tensor y = empty(x.shape(), DType::bf16);
  if (rstd) *rstd = empty({rows}, DType::f32);
  cuda::rmsnorm_forward(bf(y), rstd ? f32(*rstd) : nullptr, bf(x), bf(w), rows, dim, eps, stream());
  return y;
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        Tensor& dw, const Tensor& dresidual, GradWrite dw_write) {
  expect(dy, DType::bf16, "rmsnorm output gradient");
  if (dresidual.defined()) expect(dresidual, DType::bf16, "rmsnorm residual gradient");
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  Tensor dx = empty(x.shape(), DType::bf16);
  const __nv_bfloat16* dres = dresidual.defined() ? bf(dresidual) : nullptr;
  if (!dw.defined()) {
    cuda::rmsnorm_backward(bf(dx), static_cast<float*>(nullptr), bf(dy), bf(x), bf(w), f32(rstd),
                           dres, rows, dim, nullptr, stream());
    return dx;
  }
  Tensor scratch = empty({cuda::rmsnorm_backward_scratch_floats(rows, dim)}, DType::f32);
  const bool accumulate = dw_write == GradWrite::kAdd;
  if (dw.dtype() == DType::bf16) {
    cuda::rmsnorm_backward(bf(dx), bf(dw), bf(dy), bf(x), bf(w), f32(rstd), dres, rows, dim,
                           f32(scratch), stream(), accumulate);
  } else {
    expect(dw, DType::f32, "rmsnorm weight gradient");
    cuda::rmsnorm_backward(bf(dx), f32(dw), bf(dy), bf(x), bf(w), f32(rstd), dres, rows, dim,
                           f32(scratch), stream(), accumulate);
  }
  return dx;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& residual) {
  expect(x, DType::bf16, "linear input");
  expect(w, DType::bf16, "linear weight");
  if (residual.defined()) expect(residual, DType::bf16, "linear residual");
  const int64_t k = x.size(-1), m = x.numel() / k, n = w.size(0);
  Tensor y = empty({m, n}, DType::bf16);
  cuda::linear_forward(gemm(), bf(y), bf(x), bf(w), m, n, k, stream(),
                       residual.defined() ? bf(residual) : nullptr);
  return y;
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                       Tensor* dx_sum, GradWrite dw_write) {
  expect(dy, DType::bf16, "linear output gradient");
  if (dx_sum) expect(*dx_sum, DType::bf16, "linear input gradient sum");
  const int64_t k = x.size(-1), m = x.numel() / k, n = w.size(0);
  Tensor dx = dx_sum ? *dx_sum : empty({m, k}, DType::bf16);
  cuda::linear_backward_input(gemm(), bf(dx), bf(dy), bf(w), m, n, k, stream(),
                              /*accumulate=*/dx_sum != nullptr);
  if (!dw.defined()) return dx;
  const bool accumulate = dw_write == GradWrite::kAdd;
  if (dw.dtype() == DType::bf16) {
    cuda::linear_backward_weight(gemm(), bf(dw), bf(dy), bf(x), m, n, k, stream(), accumulate);
  } else {
    expect(dw, DType::f32, "linear weight gradient");
    cuda::linear_backward_weight(gemm(), f32(dw), bf(dy), bf(x), m, n, k, stream(), accumulate);
  }
  return dx;
}

Tensor rope(const Tensor& x, const Tensor& positions, const RotaryFrequencies& rotary,
            bool backward) {
  expect(x, DType::bf16, "rope input");
  expect(positions, DType::i32, "rope positions");
  Tensor y = empty(x.shape(), DType::bf16);
  if (backward)
    cuda::rope_backward(bf(y), bf(x), i32(positions), x.size(0), x.size(1), x.size(2),
                        rotary.inv_freq.data(), rotary.attention_scaling, stream());
  else
    cuda::rope_forward(bf(y), bf(x), i32(positions), x.size(0), x.size(1), x.size(2),
                       rotary.inv_freq.data(), rotary.attention_scaling, stream());
  return y;
}

Attention attention(const Tensor& q, const Tensor& k, const Tensor& v,
                    const cpu::AttentionShape& s) {
  expect(q, DType::bf16, "attention query");
  expect(k, DType::bf16, "attention key");
  expect(v, DType::bf16, "attention value");
  Attention a{empty(q.shape(), DType::bf16), empty({s.batch, s.n_heads, s.q_len}, DType::f32)};
  cuda::attention_forward(bf(a.out), f32(a.lse), bf(q), bf(k), bf(v), s,
                          kernel_options().attention_sm90, stream());
  return a;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Attention& fwd,
                                  const cpu::AttentionShape& s) {
  expect(dout, DType::bf16, "attention output gradient");
  // One whole attention: the Hopper kernels write bf16 gradients directly (the arena's new
  // tensors meet their alignment, so the inputs decide).
  const bool sm90 = kernel_options().attention_sm90;
  if (cuda::attention_backward_writes_bf16(s, {bf(dout), bf(q), bf(k), bf(v), bf(fwd.out)}, sm90)) {
    Tensor dq = empty(q.shape(), DType::bf16), dk = empty(k.shape(), DType::bf16),
           dv = empty(v.shape(), DType::bf16);
    Tensor scratch =
        empty({std::max<int64_t>(1, cuda::attention_backward_scratch_floats(s))}, DType::f32);
    cuda::attention_backward(bf(dq), bf(dk), bf(dv), bf(dout), bf(q), bf(k), bf(v), bf(fwd.out),
                             f32(fwd.lse), s, f32(scratch), sm90, stream());
    return {dq, dk, dv};
  }
  // Otherwise the kernels accumulate in fp32 (as for a ring, which adds several blocks into
  // them); the layers before attention read bf16.
  Tensor dq = zeros(q.shape(), DType::f32, compute_arena());
  Tensor dk = zeros(k.shape(), DType::f32, compute_arena());
  Tensor dv = zeros(v.shape(), DType::f32, compute_arena());
  attention_accumulate_backward(dq, dk, dv, dout, q, k, v, fwd.out, fwd.lse, s);
  return {convert(dq, DType::bf16, compute_arena()), convert(dk, DType::bf16, compute_arena()),
          convert(dv, DType::bf16, compute_arena())};
}

void attention_accumulate_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                                   const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse,
                                   const cpu::AttentionShape& s) {
  Tensor scratch =
      empty({std::max<int64_t>(1, cuda::attention_backward_scratch_floats(s))}, DType::f32);
  cuda::attention_backward(f32(dq), f32(dk), f32(dv), bf(dout), bf(q), bf(k), bf(v), bf(out),
                           f32(lse), s, f32(scratch), kernel_options().attention_sm90, stream());
}

void merge_attention(Tensor& out, Tensor& lse, const Attention& part, int64_t batch) {
  expect(part.out, DType::bf16, "attention block output");
  cuda::merge_attention(f32(out), f32(lse), bf(part.out), f32(part.lse), batch, out.size(0) / batch,
                        out.size(1), out.size(2), stream());
}

Tensor dropout(const Tensor& x, float p, uint64_t seed, int64_t first) {
  expect(x, DType::bf16, "dropout input");
  Tensor y = empty(x.shape(), DType::bf16);
  cuda::dropout(bf(y), bf(x), x.numel(), p, seed, first, stream());
  return y;
}

void add_bias(Tensor& x, const Tensor& b) {
  expect(x, DType::bf16, "bias input");
  expect(b, DType::bf16, "bias");
  cuda::add_bias(bf(x), bf(b), x.size(0), x.size(1), stream());
}

void bias_backward(const Tensor& dy, Tensor& db) {
  expect(dy, DType::bf16, "bias output gradient");
  expect(db, DType::f32, "bias gradient");
  cuda::bias_backward(f32(db), bf(dy), dy.size(0), dy.size(1), stream());
}

Tensor swiglu(const Tensor& g, const Tensor& u) {
  expect(g, DType::bf16, "swiglu gate");
  expect(u, DType::bf16, "swiglu up");
  Tensor h = empty(g.shape(), DType::bf16);
  cuda::swiglu_forward(bf(h), bf(g), bf(u), g.numel(), stream());
  return h;
}

SwigluGrads swiglu_backward(const Tensor& dh, const Tensor& g, const Tensor& u) {
  expect(dh, DType::bf16, "swiglu output gradient");
  SwigluGrads grads{empty(g.shape(), DType::bf16), empty(u.shape(), DType::bf16)};
  cuda::swiglu_backward(bf(grads.dg), bf(grads.du), bf(dh), bf(g), bf(u), g.numel(), stream());
  return grads;
}

// --- loss -----------------------------------------------------------------------------------

Tensor loss_accumulator() { return zeros({1}, DType::f32, compute_arena()); }

void cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor* dlogits,
                   Tensor& loss_sum) {
  expect(logits, DType::bf16, "logits");
  expect(targets, DType::i32, "targets");
  expect(loss_sum, DType::f32, "loss accumulator");
  BoundDevice& d = device();
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (dlogits) *dlogits = empty(logits.shape(), DType::bf16);
  Tensor row_loss = empty({rows}, DType::f32);
  d.loss_vocab = vocab;
  cuda::cross_entropy(f32(loss_sum), f32(row_loss), dlogits ? bf(*dlogits) : nullptr, bf(logits),
                      i32(targets), rows, vocab, grad_scale, i32(d.target_error), stream(),
                      /*check=*/false);
}

double read_loss(const Tensor& loss_sum) {
  BoundDevice& d = device();
  if (d.loss_vocab > 0) cuda::cross_entropy_check(i32(d.target_error), d.loss_vocab, stream());
  return to_host(loss_sum, d.context->compute()).data<float>()[0];
}

// --- elementwise ----------------------------------------------------------------------------

void add_inplace(Tensor& y, const Tensor& x) {
  const bool widened = y.dtype() == DType::bf16 && x.dtype() == DType::f32;  // bf16 gradient shards
  FRUGAL_CHECK((x.dtype() == y.dtype() || widened) && x.device() == Device::cuda, "add of ",
               dtype_name(x.dtype()), " to ", dtype_name(y.dtype()), " on a GPU");
  if (widened)
    cuda::add_inplace(bf(y), f32(x), y.numel(), stream());
  else if (y.dtype() == DType::bf16)
    cuda::add_inplace(bf(y), bf(x), y.numel(), stream());
  else if (y.dtype() == DType::f32)
    cuda::add_inplace(f32(y), f32(x), y.numel(), stream());
  else
    fail("no GPU add for dtype ", dtype_name(y.dtype()));
}

void scale_inplace(Tensor& y, float s) {
  if (y.dtype() == DType::bf16)
    cuda::scale_inplace(bf(y), s, y.numel(), stream());
  else if (y.dtype() == DType::f32)
    cuda::scale_inplace(f32(y), s, y.numel(), stream());
  else
    fail("no GPU scale for dtype ", dtype_name(y.dtype()));
}

void zero(Tensor& t) { fill_zero_async(t, device().context->compute()); }

int64_t normal_rows(Tensor& rows, int64_t n_rows, int64_t row_len, uint64_t key, int64_t first_row,
                    float std) {
  expect(rows, DType::f32, "initialised rows");
  const int64_t n = rows.numel();
  // Room for 8 times the expected hand-overs (1 in 10^5) and at least 4096; more (never seen)
  // and the kernel runs again with room for all of them.
  int64_t capacity = std::max<int64_t>(4096, n / 12000);
  for (;;) {
    Tensor count = zeros({1}, DType::i64, compute_arena());
    Tensor index = empty({capacity}, DType::i64);
    cuda::normal_rows(f32(rows), n_rows, row_len, key, first_row, std,
                      static_cast<int64_t*>(index.raw()),
                      static_cast<unsigned long long*>(count.raw()), capacity, stream());
    const int64_t handed = to_host(count, device().context->compute()).data<int64_t>()[0];
    if (handed > capacity) {
      capacity = handed;
      continue;
    }
    if (handed == 0) return 0;
    // The host's values for them, put in place on the GPU.
    Tensor host_index = to_host(index.rows(0, handed), device().context->compute());
    Tensor values = Tensor::empty({handed}, DType::f32);
    const int64_t* at = host_index.data<int64_t>();
    for (int64_t i = 0; i < handed; ++i)
      values.data<float>()[i] =
          cpu::normal_value(key, first_row + at[i] / row_len, at[i] % row_len, std);
    Tensor device_values = clone_async(values, compute_arena(), device().context->compute());
    cuda::scatter_values(f32(rows), static_cast<const int64_t*>(index.raw()), f32(device_values),
                         handed, stream());
    device().context->compute().synchronize();  // `values` is pageable host memory
    return handed;
  }
}

int64_t nf4_first_level(const Tensor& w, int64_t blocks, Tensor& codes, Tensor& absmax,
                        const float* midpoints) {
  expect(w, DType::f32, "weight to quantize");
  Tensor bad = empty({1}, DType::i64);
  const int64_t none = blocks;
  Tensor host_none = Tensor::empty({1}, DType::i64);
  host_none.data<int64_t>()[0] = none;
  copy(bad, host_none);
  cuda::nf4_quantize_blocks(static_cast<uint8_t*>(codes.raw()), f32(absmax), f32(w), blocks,
                            midpoints, static_cast<int64_t*>(bad.raw()), stream());
  return to_host(bad, device().context->compute()).data<int64_t>()[0];
}

void dequantize_nf4(Tensor& out, const Tensor& codes, const Tensor& absmax_codes,
                    const Tensor& scales, float offset, const float* nf4_table,
                    const float* absmax_map) {
  expect(out, DType::bf16, "dequantized weight");
  cuda::nf4_dequantize(bf(out),
                       nf4_device({codes, absmax_codes, scales, offset, nf4_table, absmax_map}),
                       out.numel(), stream());
}

void dequantize_hqq(Tensor& out, const Tensor& codes, const Tensor& scales, const Tensor& zeros) {
  expect(out, DType::bf16, "dequantized weight");
  cuda::hqq_dequantize(bf(out), hqq_device({codes, scales, zeros}), out.numel(), stream());
}

double sum_squares(const std::vector<Tensor>& xs) {
  if (xs.empty()) return 0;
  BoundDevice& d = device();
  std::vector<cuda::SquaresChunk> chunks;
  chunks.reserve(xs.size());
  for (const Tensor& x : xs) {
    if (x.dtype() == DType::bf16)  // a bf16 run's gradients
      chunks.push_back({.f32 = nullptr, .bf16 = bf(x), .n = x.numel()});
    else {
      expect(x, DType::f32, "norm input");
      chunks.push_back({.f32 = f32(x), .bf16 = nullptr, .n = x.numel()});
    }
  }
  cuda::sum_squares_many(static_cast<double*>(d.norm_sum.raw()), chunks.data(),
                         static_cast<int64_t>(chunks.size()),
                         static_cast<double*>(d.norm_scratch.raw()), stream());
  return to_host(d.norm_sum, d.context->compute()).data<double>()[0];
}

std::vector<GradHealth> grad_health(const std::vector<Tensor>& xs) {
  // Every tensor's values land in one device array, read back with one wait.
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor values = empty({std::max<int64_t>(1, n) * cuda::kGradHealthValues}, DType::f64);
  Tensor scratch = empty({cuda::kGradHealthValues * cuda::kSumSquaresScratch}, DType::f64);
  double* out = static_cast<double*>(values.raw());
  double* partial = static_cast<double*>(scratch.raw());
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& x = xs[static_cast<size_t>(i)];
    double* row = out + i * cuda::kGradHealthValues;
    if (x.dtype() == DType::bf16)  // a bf16 run's gradients
      cuda::grad_health(row, bf(x), x.numel(), partial, stream());
    else {
      expect(x, DType::f32, "gradient");
      cuda::grad_health(row, f32(x), x.numel(), partial, stream());
    }
  }
  std::vector<GradHealth> result;
  if (n == 0) return result;
  const Tensor host = to_host(values, device().context->compute());
  const double* v = host.data<double>();
  for (int64_t i = 0; i < n; ++i) {
    const double* row = v + i * cuda::kGradHealthValues;
    result.push_back({row[0], static_cast<int64_t>(row[1]), static_cast<int64_t>(row[2]),
                      static_cast<int64_t>(row[3]), xs[static_cast<size_t>(i)].numel()});
  }
  return result;
}

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s,
                  Tensor& param_copy, const Bf16Store& store) {
  // (Offloaded state is updated on the host: ops::adamw_update dispatches on the parameter.)
  if (param.dtype() == DType::bf16) {  // optim.master_dtype = bf16: the master is its own copy
    FRUGAL_CHECK(!param_copy.defined(), "a bf16 parameter is its own copy");
    expect(grad, DType::bf16, "optimizer gradient of a bf16 parameter");
    if (m.dtype() == DType::f32) {  // fp32 moments (optim.state_dtype = fp32)
      expect(v, DType::f32, "AdamW second moment of a bf16 parameter");
      const cuda::AdamWChunkBf16Master chunk{.param = bf(param),
                                             .grad = bf(grad),
                                             .m = f32(m),
                                             .v = f32(v),
                                             .n = param.numel(),
                                             .store = store};
      cuda::adamw_update(&chunk, 1, s, stream());
      return;
    }
    expect(m, DType::bf16, "AdamW first moment of a bf16 parameter");
    expect(v, DType::bf16, "AdamW second moment of a bf16 parameter");
    const cuda::AdamWChunkBf16 chunk{.param = bf(param),
                                     .grad = bf(grad),
                                     .m = bf(m),
                                     .v = bf(v),
                                     .n = param.numel(),
                                     .store = store};
    cuda::adamw_update(&chunk, 1, s, stream());
    return;
  }
  expect(param, DType::f32, "optimizer parameter");
  expect(grad, DType::f32, "optimizer gradient");
  expect(m, DType::f32, "AdamW first moment");
  expect(v, DType::f32, "AdamW second moment");
  if (param_copy.defined()) expect(param_copy, DType::bf16, "bf16 parameter copy");
  const cuda::AdamWChunk chunk{.param = f32(param),
                               .grad = f32(grad),
                               .m = f32(m),
                               .v = f32(v),
                               .param_bf16 = param_copy.defined() ? bf(param_copy) : nullptr,
                               .n = param.numel()};
  cuda::adamw_update(&chunk, 1, s, stream());
}

// --- FP8 -------------------------------------------------------------------------------------

namespace {
cudaDataType_t fp8_type(Fp8Format f) {
  return f == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}
}  // namespace

namespace {

// The cast of [rows, cols] values that `source` (a bf16 pointer, cuda::Nf4Device or
// cuda::HqqDevice) gives the kernels.
template <class Source>
Fp8Cast cast_from(const Source& source, int64_t rows, int64_t cols, const Fp8Slot& slot, bool plain,
                  bool transposed) {
  Fp8Cast out;
  out.plain = {Tensor(), slot.scale_inv, slot.format};
  out.transposed = {Tensor(), slot.scale_inv, slot.format};
  if (plain) out.plain.codes = empty({rows, cols}, DType::u8);
  if (transposed) out.transposed.codes = empty({cols, rows}, DType::u8);
  if (slot.current) cuda::fp8_amax(f32(slot.amax), source, rows * cols, stream());
  const cuda::Fp8CastState state{f32(slot.scale),
                                 f32(slot.scale_inv),
                                 slot.current ? nullptr : f32(slot.amax),
                                 slot.current ? f32(slot.amax) : nullptr,
                                 static_cast<int64_t*>(slot.counts.raw()),
                                 slot.margin};
  cuda::fp8_cast_transpose(plain ? static_cast<uint8_t*>(out.plain.codes.raw()) : nullptr,
                           transposed ? static_cast<uint8_t*>(out.transposed.codes.raw()) : nullptr,
                           source, rows, cols, slot.format, state, stream());
  return out;
}

}  // namespace

Fp8Cast fp8_cast(const Tensor& x, const Fp8Slot& slot, bool plain, bool transposed) {
  expect(x, DType::bf16, "fp8 cast input");
  return cast_from(static_cast<const __nv_bfloat16*>(bf(x)), x.size(0), x.size(1), slot, plain,
                   transposed);
}

Fp8Cast fp8_cast(const Nf4Parts& w, int64_t rows, int64_t cols, const Fp8Slot& slot, bool plain,
                 bool transposed) {
  return cast_from(nf4_device(w), rows, cols, slot, plain, transposed);
}

Fp8Cast fp8_cast(const HqqParts& w, int64_t rows, int64_t cols, const Fp8Slot& slot, bool plain,
                 bool transposed) {
  return cast_from(hqq_device(w), rows, cols, slot, plain, transposed);
}

Tensor fp8_gemm(const Fp8Matrix& a, const Fp8Matrix& b, bool fast_accumulation) {
  const int64_t m = a.codes.size(0), n = b.codes.size(0), k = a.codes.size(1);
  Tensor out = empty({m, n}, DType::bf16);
  cuda::fp8_gemm_tn(gemm(), out.raw(), CUDA_R_16BF, static_cast<const uint8_t*>(a.codes.raw()),
                    fp8_type(a.format), f32(a.scale_inv),
                    static_cast<const uint8_t*>(b.codes.raw()), fp8_type(b.format),
                    f32(b.scale_inv), m, n, k, /*accumulate=*/false, fast_accumulation, stream());
  return out;
}

void fp8_gemm_accumulate(Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b,
                         bool fast_accumulation) {
  expect(out, DType::f32, "fp8 gemm accumulator");
  const int64_t m = a.codes.size(0), n = b.codes.size(0), k = a.codes.size(1);
  cuda::fp8_gemm_tn(gemm(), out.raw(), CUDA_R_32F, static_cast<const uint8_t*>(a.codes.raw()),
                    fp8_type(a.format), f32(a.scale_inv),
                    static_cast<const uint8_t*>(b.codes.raw()), fp8_type(b.format),
                    f32(b.scale_inv), m, n, k, /*accumulate=*/true, fast_accumulation, stream());
}

void dequantize_fp8(Tensor& out, const Tensor& codes, const Tensor& scale_inv, Fp8Format format) {
  expect(out, DType::bf16, "fp8 dequantized weight");
  cuda::fp8_dequantize(bf(out), static_cast<const uint8_t*>(codes.raw()), out.numel(), format,
                       f32(scale_inv), stream());
}

Tensor fp8_transpose_codes(const Tensor& codes) {
  const int64_t rows = codes.size(0), cols = codes.size(1);
  Tensor out = empty({cols, rows}, DType::u8);
  cuda::fp8_transpose_codes(static_cast<uint8_t*>(out.raw()),
                            static_cast<const uint8_t*>(codes.raw()), rows, cols, stream());
  return out;
}

void fp8_delayed_update(Tensor& history, Tensor& scale, Tensor& scale_inv, const Tensor& max_values,
                        int margin) {
  cuda::fp8_delayed_update(f32(history), f32(scale), f32(scale_inv), f32(max_values),
                           history.size(0), scale.numel(), margin, stream());
}

void matmul(Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, int64_t m,
            int64_t n, int64_t k, float alpha, float beta, MatmulPrecision precision) {
  expect(c, DType::f32, "matmul result");
  if (a.dtype() == DType::bf16) {
    expect(b, DType::bf16, "matmul operand b");
    return cuda::matmul_bf16_f32(gemm(), f32(c), bf(a), trans_a, bf(b), trans_b, m, n, k, alpha,
                                 beta, stream());
  }
  expect(a, DType::f32, "matmul operand a");
  expect(b, DType::f32, "matmul operand b");
  cuda::matmul_f32(gemm(), f32(c), f32(a), trans_a, f32(b), trans_b, m, n, k, alpha, beta, stream(),
                   precision == MatmulPrecision::tf32);
}

namespace {

// A quantized moment's device pointers and the layout of a [rows, cols] tensor (ops.cpp has
// checked the shapes and dtypes).
cuda::Int8Moment int8_moment(const QuantizedMoment& q) {
  return {static_cast<uint8_t*>(q.codes.raw()), f32(q.absmax)};
}
cuda::Int8Layout int8_layout(const Tensor& like, const QuantizedMoment& q) {
  return {like.size(0), like.size(1), q.block};
}

}  // namespace

void adamw_int8_update(Tensor& param, const Tensor& grad, QuantizedMoment& m, QuantizedMoment& v,
                       const AdamWStep& s, Tensor& param_copy, const Bf16Store& store) {
  // (Offloaded state is updated on the host: ops::adamw_int8_update dispatches on the weight.)
  const cuda::Int8Layout layout = int8_layout(param, m);
  if (param.dtype() == DType::bf16) {  // bf16 master weights: the weight is its own copy
    FRUGAL_CHECK(!param_copy.defined(), "a bf16 parameter is its own copy");
    cuda::adamw_int8_update(bf(param), bf(grad), int8_moment(m), int8_moment(v), layout, s, store,
                            stream());
    return;
  }
  if (param_copy.defined()) expect(param_copy, DType::bf16, "bf16 parameter copy");
  cuda::adamw_int8_update(f32(param), f32(grad), int8_moment(m), int8_moment(v), layout, s,
                          param_copy.defined() ? bf(param_copy) : nullptr, stream());
}

void galore_moments_int8(QuantizedMoment& m, QuantizedMoment& v, Tensor& r, float beta1,
                         float beta2, float eps) {
  cuda::galore_moments_int8(int8_moment(m), int8_moment(v), f32(r), int8_layout(r, m), beta1, beta2,
                            eps, stream());
}

void quantize_moment(QuantizedMoment& q, const Tensor& x, bool is_signed) {
  cuda::quantize_blockwise(int8_moment(q), f32(x), int8_layout(x, q), is_signed, stream());
}

void dequantize_moment(Tensor& x, const QuantizedMoment& q, bool is_signed) {
  cuda::dequantize_blockwise(f32(x), int8_moment(q), int8_layout(x, q), is_signed, stream());
}

void galore_moments(Tensor& m, Tensor& v, Tensor& r, float beta1, float beta2, float eps) {
  expect(m, DType::f32, "GaLore first moment");
  expect(v, DType::f32, "GaLore second moment");
  expect(r, DType::f32, "GaLore projected gradient");
  cuda::galore_moments(f32(m), f32(v), f32(r), r.numel(), beta1, beta2, eps, stream());
}

void galore_apply(Tensor& param, const Tensor& delta, float step, float decay, Tensor& param_copy,
                  const Bf16Store& store) {
  expect(delta, DType::f32, "GaLore step");
  if (param.dtype() == DType::bf16) {  // a bf16 master: its own copy
    FRUGAL_CHECK(!param_copy.defined(), "a bf16 parameter is its own copy");
    return cuda::galore_apply(bf(param), f32(delta), param.numel(), step, decay, store, stream());
  }
  __nv_bfloat16* copy = nullptr;
  if (param_copy.defined()) {
    expect(param_copy, DType::bf16, "parameter copy");
    copy = bf(param_copy);
  }
  cuda::galore_apply(f32(param), f32(delta), param.numel(), step, decay, copy, stream());
}

void galore_sketch(Tensor& omega, uint64_t seed) {
  expect(omega, DType::f32, "GaLore sketch");
  cuda::galore_sketch(f32(omega), omega.numel(), seed, stream());
}

std::shared_ptr<void> record_timing_event() {
  auto event = std::make_shared<Event>(/*timing=*/true);
  event->record(device().context->compute());
  return event;
}

double elapsed_ms(const std::shared_ptr<void>& start, const std::shared_ptr<void>& end) {
  const auto& e = *static_cast<const Event*>(end.get());
  e.synchronize();
  return e.elapsed_ms_since(*static_cast<const Event*>(start.get()));
}

}  // namespace frugal::ops::gpu

#endif  // FRUGAL_HAVE_CUDA
