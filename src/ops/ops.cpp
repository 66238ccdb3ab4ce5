// Shape checks and device dispatch for every operation in ops.h.
#include "ops/ops.h"

#include <chrono>
#include <cmath>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/adamw_int8.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/bias.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/galore.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/normal_init.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "ops/attention_offset.h"
#include "ops/gpu_ops.h"

// Operations on GPU tensors go to ops/gpu_ops.cpp (built with the CUDA backend only):
//   FRUGAL_ON_GPU(t, f(args)) returns gpu::f(args) when t lives in device memory.
#ifdef FRUGAL_HAVE_CUDA
#define FRUGAL_ON_GPU(tensor, call) \
  if ((tensor).defined() && (tensor).device() == Device::cuda) return gpu::call
#else
#define FRUGAL_ON_GPU(tensor, call)
#endif

namespace frugal::ops {

namespace {

void expect_shape(const Tensor& t, const Shape& shape, const char* what) {
  FRUGAL_CHECK(t.shape() == shape, what, " has shape ", shape_string(t.shape()), ", expected ",
               shape_string(shape));
}

void expect_cpu_f32(const Tensor& t, const char* what) {
  FRUGAL_CHECK(t.defined(), what, " is undefined");
  FRUGAL_CHECK(t.device() == Device::cpu, what, ": no kernel for this device yet");
  FRUGAL_CHECK(t.dtype() == DType::f32, what, " has dtype ", dtype_name(t.dtype()),
               ", expected f32");
}

// Results of an operation are activations: they go to the compute arena of the device, never
// to the arena of an input (which may be gathered weights or offloaded state).
Arena& compute_arena(const Tensor& like) {
#ifdef FRUGAL_HAVE_CUDA
  if (like.device() == Device::cuda) return gpu::compute_arena();
#endif
  FRUGAL_CHECK(like.device() == Device::cpu, "a GPU tensor in a build without CUDA");
  return host_arena();
}

// A host tensor as f32: itself, or a bf16 one (a bf16 master or gradient shard) widened.
Tensor host_f32(const Tensor& t) {
  if (t.dtype() != DType::bf16) return t;
  return convert(t, DType::f32, host_arena());
}

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), compute_arena(t)); }

}  // namespace

// --- devices --------------------------------------------------------------------------------

void bind_device(DeviceContext* context) {
#ifdef FRUGAL_HAVE_CUDA
  gpu::bind(context);
#else
  if (context) fail("this frugal was built without CUDA");
#endif
}

DType compute_dtype(Device device) { return device == Device::cuda ? DType::bf16 : DType::f32; }

namespace {
KernelOptions g_kernel_options;  // written at start-up only, before any operation
}  // namespace

void set_kernel_options(const KernelOptions& options) { g_kernel_options = options; }

const KernelOptions& kernel_options() { return g_kernel_options; }

KernelOptions kernel_options_from_environment(const char* attention_sm90) {
  KernelOptions options;
  const std::string value = attention_sm90 ? attention_sm90 : "1";
  if (value != "0" && value != "1")
    fail("FRUGAL_ATTENTION_SM90 is '", value,
         "': 1 (the default) lets Hopper GPUs use the sm90 attention kernels, 0 keeps the "
         "FlashAttention-2 ones");
  options.attention_sm90 = value == "1";
  return options;
}

Tensor empty_like(const Tensor& like, const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, compute_arena(like));
}

Tensor zeros(const Shape& shape, DType dtype, Arena& arena) {
#ifdef FRUGAL_HAVE_CUDA
  if (arena.device() == Device::cuda) return gpu::zeros(shape, dtype, arena);
#endif
  return Tensor::zeros(shape, dtype, arena);
}

namespace {

Tensor host_bytes_as_f32(const Tensor& src) {
  Tensor bytes = src;
  if (src.device() != Device::cpu) {
    bytes = Tensor::empty(src.shape(), DType::u8);
    copy(bytes, src);
  }
  Tensor out = Tensor::empty(src.shape(), DType::f32);
  const uint8_t* in = bytes.data<uint8_t>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = static_cast<float>(in[i]);
  return out;
}

// An f32 host tensor of codes (whole numbers 0..255: a checkpoint's) as bytes; anything else is
// not a code, and the checkpoint is refused.
Tensor host_f32_as_bytes(const Tensor& src) {
  FRUGAL_CHECK(src.dtype() == DType::f32, "8-bit codes from dtype ", dtype_name(src.dtype()));
  Tensor out = Tensor::empty(src.shape(), DType::u8);
  const float* in = src.data<float>();
  uint8_t* o = out.data<uint8_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const float x = in[i];
    if (!(x >= 0.0f && x <= 255.0f && x == std::floor(x)))
      fail("8-bit optimizer state: value ", x, " at index ", i,
           " is not a code (a whole number 0..255); the checkpoint is damaged or not one of "
           "optim.state_dtype = int8");
    o[i] = static_cast<uint8_t>(x);
  }
  return out;
}

}  // namespace

void copy(Tensor& dst, const Tensor& src) {
  FRUGAL_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), "copy ",
               shape_string(src.shape()), " ", dtype_name(src.dtype()), " into ",
               shape_string(dst.shape()), " ", dtype_name(dst.dtype()));
  if (dst.device() == Device::cpu && src.device() == Device::cpu) return dst.copy_from(src);
#ifdef FRUGAL_HAVE_CUDA
  gpu::copy(dst, src);
#endif
}

Tensor convert(const Tensor& src, DType dtype, Arena& arena) {
#ifdef FRUGAL_HAVE_CUDA
  if (src.device() == Device::cuda || arena.device() == Device::cuda)
    return gpu::convert(src, dtype, arena);
#endif
  if (src.dtype() == dtype) return src.clone(arena);
  Tensor out = Tensor::empty(src.shape(), dtype, arena);
  convert_into(out, src);
  return out;
}

void convert_into(Tensor& dst, const Tensor& src) {
  FRUGAL_CHECK(src.shape() == dst.shape() && src.device() == dst.device(), "conversion of ",
               shape_string(src.shape()), " into ", shape_string(dst.shape()),
               " on another device");
  FRUGAL_ON_GPU(dst, convert_into(dst, src));
  if (src.dtype() == DType::f32 && dst.dtype() == DType::bf16)
    cpu::f32_to_bf16(dst.data<uint16_t>(), src.data<float>(), src.numel());
  else if (src.dtype() == DType::bf16 && dst.dtype() == DType::f32)
    cpu::bf16_to_f32(dst.data<float>(), src.data<uint16_t>(), src.numel());
  else
    fail("no host conversion from ", dtype_name(src.dtype()), " to ", dtype_name(dst.dtype()));
}

void assign(Tensor& dst, const Tensor& src) {
  if (src.dtype() == dst.dtype()) return copy(dst, src);
  // Codes of 8-bit optimizer state loaded from a checkpoint's f32: narrowed on the host.
  if (dst.dtype() == DType::u8 && src.device() == Device::cpu)
    return copy(dst, host_f32_as_bytes(src));
  if (src.device() == dst.device()) return convert_into(dst, src);  // one pass, no temporary
  // Converted where dst lives (a GPU converts only its own memory), then copied in.
  const Tensor there = on_device_of(src, dst);
  const Tensor converted = convert(there, dst.dtype(), compute_arena(dst));
  copy(dst, converted);
}

Tensor on_device_of(const Tensor& src, const Tensor& like) {
  if (!src.defined() || src.device() == like.device()) return src;
  Tensor out = Tensor::empty(src.shape(), src.dtype(), compute_arena(like));
  copy(out, src);
  return out;
}

Tensor to_host_f32(const Tensor& src) {
  // 8-bit optimizer state's codes come down as bytes and widen on the host (0..255 are exact in
  // f32, and checkpoints store every tensor as f32).
  if (src.dtype() == DType::u8) return host_bytes_as_f32(src);
  FRUGAL_ON_GPU(src, to_host_f32(src));
  return host_f32(src);
}

struct SideCopy::State {
  Tensor dst, src;
  void* event = nullptr;  // the GPU's, when the copy involves device memory or pinned memory
  ~State() {
#ifdef FRUGAL_HAVE_CUDA
    if (event) {
      // The buffers must outlive the copy: finish it before they can be reused.
      gpu::event_done(event);
      gpu::event_release(event);
    }
#endif
  }
};

SideCopy::SideCopy() = default;
SideCopy::~SideCopy() = default;
SideCopy::SideCopy(SideCopy&&) noexcept = default;
SideCopy& SideCopy::operator=(SideCopy&&) noexcept = default;

SideCopy::SideCopy(Tensor& dst, const Tensor& src) : state_(std::make_unique<State>()) {
  FRUGAL_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), "copy ",
               shape_string(src.shape()), " into ", shape_string(dst.shape()));
  state_->dst = dst;
  state_->src = src;
  if (dst.device() == Device::cpu && src.device() == Device::cpu) {
    dst.copy_from(src);
    return;
  }
#ifdef FRUGAL_HAVE_CUDA
  state_->event = gpu::copy_beside(dst, src);
#endif
}

void SideCopy::wait() {
#ifdef FRUGAL_HAVE_CUDA
  if (state_ && state_->event) gpu::event_wait(state_->event);
#endif
}

void SideCopy::done() {
#ifdef FRUGAL_HAVE_CUDA
  if (state_ && state_->event) gpu::event_done(state_->event);
#endif
}

bool SideCopy::on_gpu() const { return state_ && state_->event; }

void after_side_copies(const std::vector<SideCopy>& copies, std::function<void()> then) {
  bool on_gpu = false;
  for (const SideCopy& c : copies) on_gpu = on_gpu || c.on_gpu();
#ifdef FRUGAL_HAVE_CUDA
  // Every side copy runs on the communication stream, in order: a host function queued there
  // now runs after all of them.
  if (on_gpu) return gpu::call_on_comm_stream(std::move(then));
#endif
  FRUGAL_CHECK(!on_gpu, "a GPU side copy in a build without CUDA");
  then();
}

std::unique_ptr<Arena> side_copy_host_arena(std::string name) {
#ifdef FRUGAL_HAVE_CUDA
  if (gpu::has_device()) return gpu::pinned_host_arena(std::move(name));
#endif
  return std::make_unique<Arena>(std::move(name), Device::cpu);
}

// --- layers ---------------------------------------------------------------------------------

Tensor embedding(const Tensor& tokens, const Tensor& table) {
  FRUGAL_CHECK(tokens.dtype() == DType::i32 && tokens.ndim() == 1, "tokens ",
               shape_string(tokens.shape()));
  FRUGAL_ON_GPU(table, embedding(tokens, table));
  expect_cpu_f32(table, "embedding table");
  Tensor out = Tensor::empty({tokens.numel(), table.size(1)}, DType::f32, compute_arena(table));
  cpu::embedding_forward(out.data<float>(), tokens.data<int32_t>(), table.data<float>(),
                         tokens.numel(), table.size(0), table.size(1));
  return out;
}

void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  expect_shape(dout, {tokens.numel(), dtable.size(1)}, "embedding output gradient");
  FRUGAL_ON_GPU(dtable, embedding_backward(dtable, dout, tokens));
  expect_cpu_f32(dtable, "embedding gradient");
  cpu::embedding_backward(dtable.data<float>(), dout.data<float>(), tokens.data<int32_t>(),
                          tokens.numel(), dtable.size(0), dtable.size(1));
}

Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor* rstd) {
  int64_t dim = x.size(-1), rows = x.numel() / dim;
  expect_shape(w, {dim}, "rmsnorm weight");
  FRUGAL_ON_GPU(x, rmsnorm(x, w, eps, rstd));
  expect_cpu_f32(x, "rmsnorm input");
  Tensor y = empty_like(x);
  if (rstd) *rstd = Tensor::empty({rows}, DType::f32, compute_arena(x));
  cpu::rmsnorm_forward(y.data<float>(), rstd ? rstd->data<float>() : nullptr, x.data<float>(),
                       w.data<float>(), rows, dim, eps);
  return y;
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        Tensor& dw, const Tensor& dresidual, GradWrite dw_write) {
  expect_shape(dy, x.shape(), "rmsnorm output gradient");
  if (dresidual.defined()) expect_shape(dresidual, x.shape(), "rmsnorm residual gradient");
  int64_t dim = x.size(-1), rows = x.numel() / dim;
  expect_shape(rstd, {rows}, "rmsnorm rstd");
  FRUGAL_ON_GPU(x, rmsnorm_backward(dy, x, w, rstd, dw, dresidual, dw_write));
  Tensor dx = empty_like(x);
  if (dw.defined() && dw_write == GradWrite::kOverwrite) zero(dw);  // the CPU kernel adds
  cpu::rmsnorm_backward(dx.data<float>(), dw.defined() ? dw.data<float>() : nullptr,
                        dy.data<float>(), x.data<float>(), w.data<float>(), rstd.data<float>(),
                        rows, dim);
  if (dresidual.defined()) add_inplace(dx, dresidual);
  return dx;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& residual) {
  int64_t k = x.size(-1), m = x.numel() / k, n = w.size(0);
  FRUGAL_CHECK(w.ndim() == 2 && w.size(1) == k, "linear weight ", shape_string(w.shape()),
               " against input ", shape_string(x.shape()));
  if (residual.defined())
    FRUGAL_CHECK(residual.numel() == m * n, "linear residual ", shape_string(residual.shape()),
                 " against output [", m, ", ", n, "]");
  FRUGAL_ON_GPU(x, linear(x, w, residual));
  expect_cpu_f32(x, "linear input");
  expect_cpu_f32(w, "linear weight");
  Tensor y = Tensor::empty({m, n}, DType::f32, compute_arena(x));
  cpu::linear_forward(y.data<float>(), x.data<float>(), w.data<float>(), m, n, k);
  if (residual.defined()) add_inplace(y, residual);
  return y;
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                       Tensor* dx_sum, GradWrite dw_write) {
  int64_t k = x.size(-1), m = x.numel() / k, n = w.size(0);
  expect_shape(dy, {m, n}, "linear output gradient");
  if (dw.defined()) expect_shape(dw, w.shape(), "linear weight gradient");
  if (dx_sum) expect_shape(*dx_sum, {m, k}, "linear input gradient sum");
  FRUGAL_ON_GPU(x, linear_backward(dy, x, w, dw, dx_sum, dw_write));
  Tensor dx = Tensor::empty({m, k}, DType::f32, compute_arena(x));
  if (dw.defined() && dw_write == GradWrite::kOverwrite) zero(dw);  // the CPU kernel adds
  cpu::linear_backward(dx.data<float>(), dw.defined() ? dw.data<float>() : nullptr,
                       dy.data<float>(), x.data<float>(), w.data<float>(), m, n, k);
  if (!dx_sum) return dx;
  add_inplace(*dx_sum, dx);
  return *dx_sum;
}

namespace {
void check_rotary(const Tensor& x, const Tensor& positions, const RotaryFrequencies& r) {
  FRUGAL_CHECK(x.ndim() == 3 && positions.numel() == x.size(0) &&
                   static_cast<int64_t>(r.inv_freq.size()) * 2 == x.size(2),
               "rope of ", shape_string(x.shape()), " with ", positions.numel(), " positions and ",
               r.inv_freq.size(), " frequencies");
}
}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, const RotaryFrequencies& rotary) {
  check_rotary(x, positions, rotary);
  FRUGAL_ON_GPU(x, rope(x, positions, rotary, /*backward=*/false));
  expect_cpu_f32(x, "rope input");
  Tensor y = x.clone(compute_arena(x));
  cpu::rope_forward(y.data<float>(), positions.data<int32_t>(), x.size(0), x.size(1), x.size(2),
                    rotary.inv_freq.data(), rotary.attention_scaling);
  return y;
}

Tensor rope_backward(const Tensor& dy, const Tensor& positions, const RotaryFrequencies& rotary) {
  check_rotary(dy, positions, rotary);
  FRUGAL_ON_GPU(dy, rope(dy, positions, rotary, /*backward=*/true));
  Tensor dx = dy.clone(compute_arena(dy));
  cpu::rope_backward(dx.data<float>(), positions.data<int32_t>(), dy.size(0), dy.size(1),
                     dy.size(2), rotary.inv_freq.data(), rotary.attention_scaling);
  return dx;
}

cpu::AttentionShape attention_shape(const Tensor& q, const Tensor& k, int64_t batch,
                                    int64_t causal_offset, int64_t window, const char* what) {
  FRUGAL_CHECK(q.ndim() == 3 && k.ndim() == 3 && batch > 0 && q.size(0) % batch == 0 &&
                   k.size(0) % batch == 0 && q.size(2) == k.size(2) && q.size(1) % k.size(1) == 0 &&
                   causal_offset >= 0 && window >= 0,
               what, " q ", shape_string(q.shape()), " k ", shape_string(k.shape()), " batch ",
               batch, " causal_offset ", causal_offset, " window ", window);
  cpu::AttentionShape s;
  s.batch = batch;
  s.q_len = q.size(0) / batch;
  s.kv_len = k.size(0) / batch;
  s.n_heads = q.size(1);
  s.n_kv_heads = k.size(1);
  s.head_dim = q.size(2);
  s.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  s.causal_offset = causal_offset;
  s.window = window;
  return s;
}

namespace {
// Ordinary causal attention: every sequence's queries against its own keys (and, with packed
// documents, only those of its document).
cpu::AttentionShape causal_shape(const Tensor& q, const Tensor& k, int64_t batch, int64_t window,
                                 const DocumentBounds& documents) {
  FRUGAL_CHECK(q.ndim() == 3 && k.ndim() == 3 && q.size(0) == k.size(0), "attention q ",
               shape_string(q.shape()), " k ", shape_string(k.shape()));
  cpu::AttentionShape s = attention_shape(q, k, batch, 0, window, "attention");
  // Self-attention: the queries' starts and the keys' ends are those of the same rows.
  s.documents = block_document_mask({documents.start, documents.end, 0}, q, k, "attention");
  return s;
}
}  // namespace

Attention attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch,
                    int64_t window, const DocumentBounds& documents) {
  expect_shape(v, k.shape(), "attention value");
  cpu::AttentionShape s = causal_shape(q, k, batch, window, documents);
  FRUGAL_ON_GPU(q, attention(q, k, v, s));
  expect_cpu_f32(q, "attention query");
  Attention a{empty_like(q),
              Tensor::empty({batch, s.n_heads, s.q_len}, DType::f32, compute_arena(q))};
  cpu::attention_forward(a.out.data<float>(), a.lse.data<float>(), q.data<float>(), k.data<float>(),
                         v.data<float>(), s);
  return a;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Attention& fwd, int64_t batch,
                                  int64_t window, const DocumentBounds& documents) {
  expect_shape(dout, q.shape(), "attention output gradient");
  cpu::AttentionShape s = causal_shape(q, k, batch, window, documents);
  FRUGAL_ON_GPU(q, attention_backward(dout, q, k, v, fwd, s));
  AttentionGrads g{Tensor::zeros(q.shape(), DType::f32, compute_arena(q)),
                   Tensor::zeros(k.shape(), DType::f32, compute_arena(k)),
                   Tensor::zeros(v.shape(), DType::f32, compute_arena(v))};
  cpu::attention_backward(g.dq.data<float>(), g.dk.data<float>(), g.dv.data<float>(),
                          dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(),
                          fwd.out.data<float>(), fwd.lse.data<float>(), s);
  return g;
}

Tensor dropout(const Tensor& x, float p, uint64_t seed, int64_t first) {
  FRUGAL_CHECK(p >= 0.0f && p < 1.0f, "dropout probability ", p, " is not in [0, 1)");
  FRUGAL_ON_GPU(x, dropout(x, p, seed, first));
  expect_cpu_f32(x, "dropout input");
  Tensor y = empty_like(x);
  cpu::dropout(y.data<float>(), x.data<float>(), x.numel(), p, seed, first);
  return y;
}

void add_bias(Tensor& x, const Tensor& b) {
  FRUGAL_CHECK(x.ndim() == 2 && b.ndim() == 1 && b.size(0) == x.size(1), "bias ",
               shape_string(b.shape()), " for ", shape_string(x.shape()));
  FRUGAL_ON_GPU(x, add_bias(x, b));
  expect_cpu_f32(x, "bias input");
  cpu::add_bias(x.data<float>(), b.data<float>(), x.size(0), x.size(1));
}

void bias_backward(const Tensor& dy, Tensor& db) {
  FRUGAL_CHECK(dy.ndim() == 2 && db.ndim() == 1 && db.size(0) == dy.size(1), "bias gradient ",
               shape_string(db.shape()), " of ", shape_string(dy.shape()));
  FRUGAL_ON_GPU(dy, bias_backward(dy, db));
  expect_cpu_f32(dy, "bias output gradient");
  cpu::bias_backward(db.data<float>(), dy.data<float>(), dy.size(0), dy.size(1));
}

Tensor swiglu(const Tensor& g, const Tensor& u) {
  expect_shape(u, g.shape(), "swiglu up");
  FRUGAL_ON_GPU(g, swiglu(g, u));
  expect_cpu_f32(g, "swiglu gate");
  Tensor h = empty_like(g);
  cpu::swiglu_forward(h.data<float>(), g.data<float>(), u.data<float>(), g.numel());
  return h;
}

SwigluGrads swiglu_backward(const Tensor& dh, const Tensor& g, const Tensor& u) {
  expect_shape(dh, g.shape(), "swiglu output gradient");
  FRUGAL_ON_GPU(g, swiglu_backward(dh, g, u));
  SwigluGrads grads{empty_like(g), empty_like(u)};
  cpu::swiglu_backward(grads.dg.data<float>(), grads.du.data<float>(), dh.data<float>(),
                       g.data<float>(), u.data<float>(), g.numel());
  return grads;
}

Tensor loss_accumulator(const Tensor& like) {
  FRUGAL_ON_GPU(like, loss_accumulator());
  return Tensor::zeros({1}, DType::f64, compute_arena(like));
}

void cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor* dlogits,
                   Tensor& loss_sum) {
  FRUGAL_CHECK(
      logits.ndim() == 2 && targets.numel() == logits.size(0) && targets.dtype() == DType::i32,
      "logits ", shape_string(logits.shape()), " targets ", shape_string(targets.shape()));
  FRUGAL_ON_GPU(logits, cross_entropy(logits, targets, grad_scale, dlogits, loss_sum));
  expect_cpu_f32(logits, "logits");
  if (dlogits) *dlogits = empty_like(logits);
  loss_sum.data<double>()[0] +=
      cpu::cross_entropy(dlogits ? dlogits->data<float>() : nullptr, logits.data<float>(),
                         targets.data<int32_t>(), logits.size(0), logits.size(1), grad_scale);
}

double read_loss(const Tensor& loss_sum) {
  FRUGAL_ON_GPU(loss_sum, read_loss(loss_sum));
  return loss_sum.data<double>()[0];
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = empty_like(a);
  copy(y, a);
  add_inplace(y, b);
  return y;
}

void add_inplace(Tensor& y, const Tensor& x) {
  FRUGAL_ON_GPU(y, add_inplace(y, x));
  FRUGAL_CHECK(x.numel() == y.numel(), "add ", shape_string(x.shape()), " to ",
               shape_string(y.shape()));
  if (y.dtype() == DType::bf16 && y.device() == Device::cpu) {  // a bf16 gradient shard
    expect_cpu_f32(x, "addend of a bf16 sum");
    return cpu::add_inplace(y.data<uint16_t>(), x.data<float>(), y.numel());
  }
  expect_cpu_f32(y, "sum");
  cpu::add_inplace(y.data<float>(), x.data<float>(), y.numel());
}

void scale_inplace(Tensor& y, float s) {
  FRUGAL_ON_GPU(y, scale_inplace(y, s));
  expect_cpu_f32(y, "scaled tensor");
  cpu::scale_inplace(y.data<float>(), s, y.numel());
}

void zero(Tensor& t) {
  FRUGAL_ON_GPU(t, zero(t));
  t.fill_zero();
}

double sum_squares(const std::vector<Tensor>& xs) {
  if (!xs.empty()) {
    FRUGAL_ON_GPU(xs.front(), sum_squares(xs));
  }
  double sum = 0;
  for (const Tensor& x : xs) {
    const Tensor wide = host_f32(x);  // bf16 gradient shards widen exactly
    expect_cpu_f32(wide, "norm input");
    sum += cpu::sum_squares(wide.data<float>(), wide.numel());
  }
  return sum;
}

std::vector<GradHealth> grad_health(const std::vector<Tensor>& xs) {
  if (!xs.empty()) {
    FRUGAL_ON_GPU(xs.front(), grad_health(xs));
  }
  std::vector<GradHealth> out;
  for (const Tensor& x : xs) {
    const Tensor wide = host_f32(x);
    expect_cpu_f32(wide, "gradient");
    cpu::GradHealthCounts c = cpu::grad_health(wide.data<float>(), wide.numel());
    if (x.dtype() == DType::bf16) c.bf16_underflow = c.bf16_overflow = 0;  // bf16 already (GPU's)
    out.push_back({c.sum_squares, c.nonfinite, c.bf16_underflow, c.bf16_overflow, x.numel()});
  }
  return out;
}

int64_t normal_rows(Tensor& rows, uint64_t key, int64_t first_row, float std) {
  const int64_t n_rows = rows.ndim() == 0 ? 1 : rows.size(0);
  const int64_t row_len = n_rows ? rows.numel() / n_rows : 0;
  FRUGAL_ON_GPU(rows, normal_rows(rows, n_rows, row_len, key, first_row, std));
  expect_cpu_f32(rows, "initialised rows");
  cpu::normal_rows(rows.data<float>(), n_rows, row_len, key, first_row, std);
  return 0;
}

int64_t nf4_first_level(const Tensor& w, int64_t blocks, Tensor& codes, Tensor& absmax,
                        const float* midpoints) {
  FRUGAL_CHECK(blocks >= 0 && w.dtype() == DType::f32 && w.numel() >= blocks * 64 &&
                   codes.dtype() == DType::u8 && codes.numel() >= blocks * 32 &&
                   absmax.dtype() == DType::f32 && absmax.numel() >= blocks &&
                   codes.device() == w.device() && absmax.device() == w.device(),
               "nf4_first_level of ", blocks, " blocks from ", w.numel(), " ",
               dtype_name(w.dtype()), " values into ", codes.numel(), " code bytes and ",
               absmax.numel(), " absmax values");
  FRUGAL_ON_GPU(w, nf4_first_level(w, blocks, codes, absmax, midpoints));
  return cpu::nf4_quantize_blocks(codes.data<uint8_t>(), absmax.data<float>(), w.data<float>(),
                                  blocks, midpoints);
}

void dequantize_nf4(Tensor& out, const Tensor& codes, const Tensor& absmax_codes,
                    const Tensor& scales, float offset, const float* nf4_table,
                    const float* absmax_map) {
  const int64_t n = out.numel();
  FRUGAL_CHECK(n % 64 == 0 && codes.numel() * 2 >= n && absmax_codes.numel() * 64 >= n &&
                   codes.device() == out.device() && absmax_codes.device() == out.device() &&
                   scales.device() == out.device() && scales.dtype() == DType::f32,
               "dequantize_nf4 of ", n, " values from ", codes.numel(), " code bytes and ",
               absmax_codes.numel(), " absmax codes");
  FRUGAL_ON_GPU(out,
                dequantize_nf4(out, codes, absmax_codes, scales, offset, nf4_table, absmax_map));
  expect_cpu_f32(out, "dequantized weight");
  cpu::nf4_dequantize(out.data<float>(), codes.data<uint8_t>(), absmax_codes.data<uint8_t>(),
                      scales.data<float>(), offset, nf4_table, absmax_map, n);
}

void dequantize_hqq(Tensor& out, const Tensor& codes, const Tensor& scales, const Tensor& zeros) {
  const int64_t n = out.numel();
  FRUGAL_CHECK(n % 64 == 0 && codes.numel() * 2 >= n && scales.numel() * 64 >= n &&
                   zeros.numel() * 64 >= n && codes.device() == out.device() &&
                   scales.device() == out.device() && zeros.device() == out.device(),
               "dequantize_hqq of ", n, " values from ", codes.numel(), " code bytes");
  FRUGAL_ON_GPU(out, dequantize_hqq(out, codes, scales, zeros));
  expect_cpu_f32(out, "dequantized weight");
  cpu::hqq_dequantize(out.data<float>(), codes.data<uint8_t>(), scales.data<float>(),
                      zeros.data<float>(), n);
}

}  // namespace frugal::ops

namespace frugal::ops {

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s,
                  Tensor param_copy, const Bf16Store& store) {
  expect_shape(grad, param.shape(), "optimizer gradient");
  expect_shape(m, param.shape(), "AdamW first moment");
  expect_shape(v, param.shape(), "AdamW second moment");
  if (param_copy.defined()) expect_shape(param_copy, param.shape(), "parameter copy");
  FRUGAL_ON_GPU(param, adamw_update(param, grad, m, v, s, param_copy, store));
  if (param.dtype() == DType::bf16) {  // a bf16 master (optim.master_dtype = bf16)
    FRUGAL_CHECK(param.device() == Device::cpu && !param_copy.defined() &&
                     grad.dtype() == DType::bf16 && grad.device() == Device::cpu &&
                     m.dtype() == v.dtype() &&
                     (m.dtype() == DType::f32 || m.dtype() == DType::bf16),
                 "AdamW of a bf16 host master needs a bf16 gradient, no copy and moments both f32 "
                 "or both bf16, not ",
                 dtype_name(grad.dtype()), " ", dtype_name(m.dtype()), " ", dtype_name(v.dtype()));
    if (m.dtype() == DType::f32)
      return cpu::adamw_update_bf16(param.data<uint16_t>(), grad.data<uint16_t>(), m.data<float>(),
                                    v.data<float>(), param.numel(), s, store);
    return cpu::adamw_update_bf16(param.data<uint16_t>(), grad.data<uint16_t>(), m.data<uint16_t>(),
                                  v.data<uint16_t>(), param.numel(), s, store);
  }
  expect_cpu_f32(param, "optimizer parameter");
  // An offloaded master updated on the host: its bf16 copy, rounded on the host in the same
  // pass.
  if (param_copy.defined())
    FRUGAL_CHECK(param_copy.device() == Device::cpu && param_copy.dtype() == DType::bf16,
                 "the copy of a host parameter must be a bf16 host tensor");
  cpu::adamw_update(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(),
                    param.numel(), s, param_copy.defined() ? param_copy.data<uint16_t>() : nullptr);
}

namespace {

// The layout of a quantized moment of a 2-D tensor of `shape`, its tensors checked against it.
cpu::Int8Layout moment_layout(const QuantizedMoment& q, const Shape& shape, const char* what) {
  FRUGAL_CHECK(shape.size() == 2, what, ": 8-bit state is for 2-D tensors, not ",
               shape_string(shape));
  FRUGAL_CHECK(q.block >= 1, what, ": block of ", q.block);
  const cpu::Int8Layout layout{shape[0], shape[1], q.block};
  FRUGAL_CHECK(q.codes.defined() && q.codes.dtype() == DType::u8, what, ": codes must be u8");
  FRUGAL_CHECK(q.absmax.defined() && q.absmax.dtype() == DType::f32, what, ": absmax must be f32");
  expect_shape(q.codes, shape, what);
  expect_shape(q.absmax, {shape[0], layout.blocks_per_row()}, what);
  return layout;
}

cpu::Int8Moment host_moment(const QuantizedMoment& q) {
  return {const_cast<uint8_t*>(q.codes.data<uint8_t>()),
          const_cast<float*>(q.absmax.data<float>())};
}

}  // namespace

QuantizedMoment quantized_moment_zeros(int64_t rows, int64_t cols, int64_t block, Arena& arena) {
  FRUGAL_CHECK(rows >= 0 && cols >= 0 && block >= 1, "8-bit moment of ", rows, " x ", cols,
               " in blocks of ", block);
  QuantizedMoment q;
  q.block = block;
  q.codes = zeros({rows, cols}, DType::u8, arena);
  q.absmax = zeros({rows, (cols + block - 1) / block}, DType::f32, arena);
  return q;
}

void adamw_int8_update(Tensor& param, const Tensor& grad, QuantizedMoment& m, QuantizedMoment& v,
                       const AdamWStep& s, Tensor param_copy, const Bf16Store& store) {
  expect_shape(grad, param.shape(), "optimizer gradient");
  const cpu::Int8Layout layout = moment_layout(m, param.shape(), "8-bit first moment");
  moment_layout(v, param.shape(), "8-bit second moment");
  FRUGAL_CHECK(m.block == v.block, "8-bit moments in blocks of ", m.block, " and ", v.block);
  if (param_copy.defined()) expect_shape(param_copy, param.shape(), "parameter copy");
  FRUGAL_CHECK(grad.dtype() == param.dtype() &&
                   (param.dtype() == DType::f32 || param.dtype() == DType::bf16),
               "8-bit AdamW needs an f32 or bf16 weight with a gradient of its dtype, not ",
               dtype_name(param.dtype()), " and ", dtype_name(grad.dtype()));
  FRUGAL_CHECK(grad.device() == param.device() && m.codes.device() == param.device() &&
                   v.codes.device() == param.device(),
               "8-bit AdamW: weight, gradient and moments on different devices");
  FRUGAL_ON_GPU(param, adamw_int8_update(param, grad, m, v, s, param_copy, store));
  if (param.dtype() == DType::bf16) {
    FRUGAL_CHECK(!param_copy.defined(), "a bf16 weight is its own copy");
    cpu::adamw_int8_update(param.data<uint16_t>(), grad.data<uint16_t>(), host_moment(m),
                           host_moment(v), layout, s, store);
    return;
  }
  if (param_copy.defined())
    FRUGAL_CHECK(param_copy.device() == Device::cpu && param_copy.dtype() == DType::bf16,
                 "the copy of a host parameter must be a bf16 host tensor");
  cpu::adamw_int8_update(param.data<float>(), grad.data<float>(), host_moment(m), host_moment(v),
                         layout, s, param_copy.defined() ? param_copy.data<uint16_t>() : nullptr);
}

void galore_moments_int8(QuantizedMoment& m, QuantizedMoment& v, Tensor& r, float beta1,
                         float beta2, float eps) {
  const cpu::Int8Layout layout = moment_layout(m, r.shape(), "GaLore 8-bit first moment");
  moment_layout(v, r.shape(), "GaLore 8-bit second moment");
  FRUGAL_CHECK(m.block == v.block, "8-bit moments in blocks of ", m.block, " and ", v.block);
  FRUGAL_CHECK(
      r.dtype() == DType::f32 && m.codes.device() == r.device() && v.codes.device() == r.device(),
      "GaLore's 8-bit moments need an f32 projected gradient on their device");
  FRUGAL_ON_GPU(r, galore_moments_int8(m, v, r, beta1, beta2, eps));
  cpu::galore_moments_int8(host_moment(m), host_moment(v), r.data<float>(), layout, beta1, beta2,
                           eps);
}

void quantize_moment(QuantizedMoment& q, const Tensor& x, bool is_signed) {
  const cpu::Int8Layout layout = moment_layout(q, x.shape(), "8-bit moment");
  FRUGAL_CHECK(x.dtype() == DType::f32 && x.device() == q.codes.device(),
               "an 8-bit moment is quantized from f32 on its device");
  FRUGAL_ON_GPU(x, quantize_moment(q, x, is_signed));
  cpu::quantize_blockwise(host_moment(q), x.data<float>(), layout, is_signed);
}

void dequantize_moment(Tensor& x, const QuantizedMoment& q, bool is_signed) {
  const cpu::Int8Layout layout = moment_layout(q, x.shape(), "8-bit moment");
  FRUGAL_CHECK(x.dtype() == DType::f32 && x.device() == q.codes.device(),
               "an 8-bit moment is dequantized into f32 on its device");
  FRUGAL_ON_GPU(x, dequantize_moment(x, q, is_signed));
  cpu::dequantize_blockwise(x.data<float>(), host_moment(q), layout, is_signed);
}

}  // namespace frugal::ops

namespace frugal::ops {

void matmul(Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float alpha,
            float beta, MatmulPrecision precision) {
  FRUGAL_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, "matmul of ",
               shape_string(a.shape()), " and ", shape_string(b.shape()), " into ",
               shape_string(c.shape()));
  const int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  FRUGAL_CHECK((trans_b ? b.size(1) : b.size(0)) == k && c.size(0) == m && c.size(1) == n,
               "matmul of ", shape_string(a.shape()), trans_a ? "^T" : "", " and ",
               shape_string(b.shape()), trans_b ? "^T" : "", " into ", shape_string(c.shape()));
  FRUGAL_CHECK(c.dtype() == DType::f32 && a.dtype() == b.dtype() &&
                   (a.dtype() == DType::f32 || a.dtype() == DType::bf16),
               "matmul needs an f32 result and operands both f32 or both bf16, not ",
               dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), " into ",
               dtype_name(c.dtype()));
  FRUGAL_CHECK(a.device() == c.device() && b.device() == c.device(),
               "matmul operands on different devices");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f) return zero(c);
    return scale_inplace(c, beta);
  }
  FRUGAL_ON_GPU(c, matmul(c, a, trans_a, b, trans_b, m, n, k, alpha, beta, precision));
  (void)precision;  // the CPU multiplies in fp32
  if (a.dtype() == DType::bf16) {
    // Widened exactly; the products of the widened values are the bf16 products.
    const Tensor wide_a = convert(a, DType::f32, compute_arena(c));
    const Tensor wide_b = convert(b, DType::f32, compute_arena(c));
    return cpu::matmul(c.data<float>(), wide_a.data<float>(), trans_a, wide_b.data<float>(),
                       trans_b, m, n, k, alpha, beta);
  }
  cpu::matmul(c.data<float>(), a.data<float>(), trans_a, b.data<float>(), trans_b, m, n, k, alpha,
              beta);
}

void galore_moments(Tensor& m, Tensor& v, Tensor& r, float beta1, float beta2, float eps) {
  expect_shape(m, r.shape(), "GaLore first moment");
  expect_shape(v, r.shape(), "GaLore second moment");
  FRUGAL_CHECK(m.dtype() == DType::f32 && v.dtype() == DType::f32 && r.dtype() == DType::f32 &&
                   m.device() == r.device() && v.device() == r.device(),
               "GaLore moments need f32 tensors on one device");
  FRUGAL_ON_GPU(r, galore_moments(m, v, r, beta1, beta2, eps));
  cpu::galore_moments(m.data<float>(), v.data<float>(), r.data<float>(), r.numel(), beta1, beta2,
                      eps);
}

void galore_apply(Tensor& param, const Tensor& delta, float step, float decay, Tensor param_copy,
                  const Bf16Store& store) {
  expect_shape(delta, param.shape(), "GaLore step");
  if (param_copy.defined()) expect_shape(param_copy, param.shape(), "parameter copy");
  FRUGAL_CHECK(delta.dtype() == DType::f32 && delta.device() == param.device(),
               "GaLore step must be f32 beside its parameter");
  FRUGAL_ON_GPU(param, galore_apply(param, delta, step, decay, param_copy, store));
  if (param.dtype() == DType::bf16 && param.device() == Device::cpu) {  // a bf16 master
    FRUGAL_CHECK(!param_copy.defined(), "a bf16 master is its own copy");
    return cpu::galore_apply_bf16(param.data<uint16_t>(), delta.data<float>(), param.numel(), step,
                                  decay, store);
  }
  expect_cpu_f32(param, "GaLore parameter");
  if (param_copy.defined())
    FRUGAL_CHECK(param_copy.device() == Device::cpu && param_copy.dtype() == DType::bf16,
                 "the copy of a host parameter must be a bf16 host tensor");
  cpu::galore_apply(param.data<float>(), delta.data<float>(), param.numel(), step, decay,
                    param_copy.defined() ? param_copy.data<uint16_t>() : nullptr);
}

void galore_sketch(Tensor& omega, uint64_t seed) {
  FRUGAL_CHECK(omega.dtype() == DType::f32, "GaLore sketch must be f32, not ",
               dtype_name(omega.dtype()));
  FRUGAL_ON_GPU(omega, galore_sketch(omega, seed));
  cpu::galore_sketch(omega.data<float>(), omega.numel(), seed);
}

namespace {
double host_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

TimeMark::TimeMark(Device device) {
#ifdef FRUGAL_HAVE_CUDA
  if (device == Device::cuda) {
    event_ = gpu::record_timing_event();
    return;
  }
#endif
  (void)device;
  host_s_ = host_seconds();
}

double TimeMark::ms_since(const TimeMark& start) const {
#ifdef FRUGAL_HAVE_CUDA
  if (event_) return gpu::elapsed_ms(start.event_, event_);
#endif
  return 1e3 * (host_s_ - start.host_s_);
}

}  // namespace frugal::ops
