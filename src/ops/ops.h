// The operations the model is written in: each takes and returns Tensors, checks shapes, and
// dispatches on the tensor's device to a kernel (kernels/cpu today). Model code never sees a
// kernel or a device API.
#pragma once

#include "core/tensor.h"
#include "kernels/cpu/adamw.h"

namespace frugal::ops {

// --- layers -----------------------------------------------------------------------------
// tokens [T] i32, table [V, H] -> [T, H]
Tensor embedding(const Tensor& tokens, const Tensor& table);
void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens);  // +=

// x [T, H], w [H] -> y [T, H]; rstd [T] saved when not null
Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor* rstd);
// returns dx; dw accumulated
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        Tensor& dw);

// x [T, K], w [N, K] (Hugging Face layout) -> x w^T [T, N]
Tensor linear(const Tensor& x, const Tensor& w);
// returns dx; dw accumulated (dw may be undefined for a frozen weight)
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw);

// x [T, heads, head_dim] rotated by positions [T] (i32); returns a new tensor
Tensor rope(const Tensor& x, const Tensor& positions, float theta);
Tensor rope_backward(const Tensor& dy, const Tensor& positions, float theta);

struct Attention {
  Tensor out;  // [B*S, n_heads, head_dim]
  Tensor lse;  // [B, n_heads, S]
};
// q [B*S, n_heads, D], k, v [B*S, n_kv_heads, D]; causal within each of the B sequences.
Attention attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch);
struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Attention& fwd, int64_t batch);

// silu(g) * u
Tensor swiglu(const Tensor& g, const Tensor& u);
struct SwigluGrads {
  Tensor dg, du;
};
SwigluGrads swiglu_backward(const Tensor& dh, const Tensor& g, const Tensor& u);

// --- loss ---------------------------------------------------------------------------------
// Sum over counted rows (targets >= 0) of -log softmax(logits)[target]. When dlogits is not
// null it receives grad_scale * d(sum)/d(logits).
double cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale,
                     Tensor* dlogits);

// --- elementwise --------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
void add_inplace(Tensor& y, const Tensor& x);
void scale_inplace(Tensor& y, float s);
void zero(Tensor& t);
double sum_squares(const Tensor& x);

// --- optimizer ----------------------------------------------------------------------------
using AdamWStep = cpu::AdamWStep;
// One AdamW update of param with grad, moments m and v (all the same shape, f32).
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s);

}  // namespace frugal::ops
