// Shape checks and device dispatch for every operation in ops.h.
#include "ops/ops.h"

#include <cmath>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

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
  FRUGAL_CHECK(like.device() == Device::cpu, "no compute arena for this device yet");
  return host_arena();
}

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), compute_arena(t)); }

}  // namespace

Tensor embedding(const Tensor& tokens, const Tensor& table) {
  expect_cpu_f32(table, "embedding table");
  FRUGAL_CHECK(tokens.dtype() == DType::i32 && tokens.ndim() == 1, "tokens ",
               shape_string(tokens.shape()));
  Tensor out = Tensor::empty({tokens.numel(), table.size(1)}, DType::f32, compute_arena(table));
  cpu::embedding_forward(out.data<float>(), tokens.data<int32_t>(), table.data<float>(),
                         tokens.numel(), table.size(0), table.size(1));
  return out;
}

void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  expect_cpu_f32(dtable, "embedding gradient");
  expect_shape(dout, {tokens.numel(), dtable.size(1)}, "embedding output gradient");
  cpu::embedding_backward(dtable.data<float>(), dout.data<float>(), tokens.data<int32_t>(),
                          tokens.numel(), dtable.size(0), dtable.size(1));
}

Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor* rstd) {
  expect_cpu_f32(x, "rmsnorm input");
  int64_t dim = x.size(-1), rows = x.numel() / dim;
  expect_shape(w, {dim}, "rmsnorm weight");
  Tensor y = empty_like(x);
  if (rstd) *rstd = Tensor::empty({rows}, DType::f32, compute_arena(x));
  cpu::rmsnorm_forward(y.data<float>(), rstd ? rstd->data<float>() : nullptr, x.data<float>(),
                       w.data<float>(), rows, dim, eps);
  return y;
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        Tensor& dw) {
  expect_shape(dy, x.shape(), "rmsnorm output gradient");
  int64_t dim = x.size(-1), rows = x.numel() / dim;
  expect_shape(rstd, {rows}, "rmsnorm rstd");
  Tensor dx = empty_like(x);
  cpu::rmsnorm_backward(dx.data<float>(), dw.defined() ? dw.data<float>() : nullptr,
                        dy.data<float>(), x.data<float>(), w.data<float>(), rstd.data<float>(),
                        rows, dim);
  return dx;
}

Tensor linear(const Tensor& x, const Tensor& w) {
  expect_cpu_f32(x, "linear input");
  expect_cpu_f32(w, "linear weight");
  int64_t k = x.size(-1), m = x.numel() / k, n = w.size(0);
  FRUGAL_CHECK(w.ndim() == 2 && w.size(1) == k, "linear weight ", shape_string(w.shape()),
               " against input ", shape_string(x.shape()));
  Tensor y = Tensor::empty({m, n}, DType::f32, compute_arena(x));
  cpu::linear_forward(y.data<float>(), x.data<float>(), w.data<float>(), m, n, k);
  return y;
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw) {
  int64_t k = x.size(-1), m = x.numel() / k, n = w.size(0);
  expect_shape(dy, {m, n}, "linear output gradient");
  if (dw.defined()) expect_shape(dw, w.shape(), "linear weight gradient");
  Tensor dx = Tensor::empty({m, k}, DType::f32, compute_arena(x));
  cpu::linear_backward(dx.data<float>(), dw.defined() ? dw.data<float>() : nullptr,
                       dy.data<float>(), x.data<float>(), w.data<float>(), m, n, k);
  return dx;
}

Tensor rope(const Tensor& x, const Tensor& positions, float theta) {
  expect_cpu_f32(x, "rope input");
  FRUGAL_CHECK(x.ndim() == 3 && positions.numel() == x.size(0), "rope of ", shape_string(x.shape()),
               " with ", positions.numel(), " positions");
  Tensor y = x.clone(compute_arena(x));
  cpu::rope_forward(y.data<float>(), positions.data<int32_t>(), x.size(0), x.size(1), x.size(2),
                    theta);
  return y;
}

Tensor rope_backward(const Tensor& dy, const Tensor& positions, float theta) {
  Tensor dx = dy.clone(compute_arena(dy));
  cpu::rope_backward(dx.data<float>(), positions.data<int32_t>(), dy.size(0), dy.size(1),
                     dy.size(2), theta);
  return dx;
}

namespace {
cpu::AttentionShape attention_shape(const Tensor& q, const Tensor& k, int64_t batch) {
  FRUGAL_CHECK(q.ndim() == 3 && k.ndim() == 3 && q.size(0) % batch == 0 && q.size(0) == k.size(0) &&
                   q.size(2) == k.size(2) && q.size(1) % k.size(1) == 0,
               "attention q ", shape_string(q.shape()), " k ", shape_string(k.shape()), " batch ",
               batch);
  cpu::AttentionShape s;
  s.batch = batch;
  s.q_len = s.kv_len = q.size(0) / batch;
  s.n_heads = q.size(1);
  s.n_kv_heads = k.size(1);
  s.head_dim = q.size(2);
  s.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  s.causal_offset = 0;
  return s;
}
}  // namespace

Attention attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch) {
  expect_cpu_f32(q, "attention query");
  expect_shape(v, k.shape(), "attention value");
  cpu::AttentionShape s = attention_shape(q, k, batch);
  Attention a{empty_like(q), Tensor::empty({batch, s.n_heads, s.q_len}, DType::f32, compute_arena(q))};
  cpu::attention_forward(a.out.data<float>(), a.lse.data<float>(), q.data<float>(), k.data<float>(),
                         v.data<float>(), s);
  return a;
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Attention& fwd, int64_t batch) {
  expect_shape(dout, q.shape(), "attention output gradient");
  cpu::AttentionShape s = attention_shape(q, k, batch);
  AttentionGrads g{Tensor::zeros(q.shape(), DType::f32, compute_arena(q)),
                   Tensor::zeros(k.shape(), DType::f32, compute_arena(k)),
                   Tensor::zeros(v.shape(), DType::f32, compute_arena(v))};
  cpu::attention_backward(g.dq.data<float>(), g.dk.data<float>(), g.dv.data<float>(),
                          dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(),
                          fwd.out.data<float>(), fwd.lse.data<float>(), s);
  return g;
}

Tensor swiglu(const Tensor& g, const Tensor& u) {
  expect_cpu_f32(g, "swiglu gate");
  expect_shape(u, g.shape(), "swiglu up");
  Tensor h = empty_like(g);
  cpu::swiglu_forward(h.data<float>(), g.data<float>(), u.data<float>(), g.numel());
  return h;
}

SwigluGrads swiglu_backward(const Tensor& dh, const Tensor& g, const Tensor& u) {
  expect_shape(dh, g.shape(), "swiglu output gradient");
  SwigluGrads grads{empty_like(g), empty_like(u)};
  cpu::swiglu_backward(grads.dg.data<float>(), grads.du.data<float>(), dh.data<float>(),
                       g.data<float>(), u.data<float>(), g.numel());
  return grads;
}

double cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale,
                     Tensor* dlogits) {
  expect_cpu_f32(logits, "logits");
  FRUGAL_CHECK(
      logits.ndim() == 2 && targets.numel() == logits.size(0) && targets.dtype() == DType::i32,
      "logits ", shape_string(logits.shape()), " targets ", shape_string(targets.shape()));
  if (dlogits) *dlogits = empty_like(logits);
  return cpu::cross_entropy(dlogits ? dlogits->data<float>() : nullptr, logits.data<float>(),
                            targets.data<int32_t>(), logits.size(0), logits.size(1), grad_scale);
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = a.clone(compute_arena(a));
  add_inplace(y, b);
  return y;
}

void add_inplace(Tensor& y, const Tensor& x) {
  expect_cpu_f32(y, "sum");
  FRUGAL_CHECK(x.numel() == y.numel(), "add ", shape_string(x.shape()), " to ",
               shape_string(y.shape()));
  cpu::add_inplace(y.data<float>(), x.data<float>(), y.numel());
}

void scale_inplace(Tensor& y, float s) {
  expect_cpu_f32(y, "scaled tensor");
  cpu::scale_inplace(y.data<float>(), s, y.numel());
}

void zero(Tensor& t) { t.fill_zero(); }

double sum_squares(const Tensor& x) {
  expect_cpu_f32(x, "norm input");
  return cpu::sum_squares(x.data<float>(), x.numel());
}

}  // namespace frugal::ops

namespace frugal::ops {

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s) {
  expect_cpu_f32(param, "optimizer parameter");
  expect_shape(grad, param.shape(), "optimizer gradient");
  expect_shape(m, param.shape(), "AdamW first moment");
  expect_shape(v, param.shape(), "AdamW second moment");
  cpu::adamw_update(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(),
                    param.numel(), s);
}

}  // namespace frugal::ops
