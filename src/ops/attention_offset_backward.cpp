// Shape checks and dispatch for attention_block_backward (attention_offset_backward.h).
#include "ops/attention_offset_backward.h"

#include <cmath>
#include <initializer_list>

#include "kernels/cpu/attention.h"
#include "ops/gpu_ops.h"
#include "ops/ops.h"

namespace frugal::ops {

void attention_block_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, int64_t batch, int64_t causal_offset) {
  // On the CPU every tensor is f32; on a GPU the inputs are bf16 and dq, dk, dv, lse fp32.
  const Device device = q.defined() ? q.device() : Device::cpu;
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dq, &dk, &dv, &lse})
    FRUGAL_CHECK(t->defined() && t->device() == device && t->dtype() == DType::f32,
                 "attention_block_backward: the gradients and lse must be f32 on the inputs' device");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dout, &q, &k, &v, &out})
    FRUGAL_CHECK(t->defined() && t->device() == device && t->dtype() == compute_dtype(device),
                 "attention_block_backward inputs must be ", dtype_name(compute_dtype(device)),
                 " tensors of one device");
  FRUGAL_CHECK(q.ndim() == 3 && k.ndim() == 3, "attention_block_backward q ",
               shape_string(q.shape()), " k ", shape_string(k.shape()));
  FRUGAL_CHECK(batch > 0 && q.size(0) % batch == 0 && k.size(0) % batch == 0 &&
                   q.size(2) == k.size(2) && q.size(1) % k.size(1) == 0 && causal_offset >= 0,
               "attention_block_backward q ", shape_string(q.shape()), " k ",
               shape_string(k.shape()), " batch ", batch, " causal_offset ", causal_offset);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dq, &dout, &out})
    FRUGAL_CHECK(t->shape() == q.shape(), "attention_block_backward: ", shape_string(t->shape()),
                 " against query ", shape_string(q.shape()));
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dk, &dv, &v})
    FRUGAL_CHECK(t->shape() == k.shape(), "attention_block_backward: ", shape_string(t->shape()),
                 " against key ", shape_string(k.shape()));
  cpu::AttentionShape s;
  s.batch = batch;
  s.q_len = q.size(0) / batch;
  s.kv_len = k.size(0) / batch;
  s.n_heads = q.size(1);
  s.n_kv_heads = k.size(1);
  s.head_dim = q.size(2);
  s.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));  // as ops::attention
  s.causal_offset = causal_offset;
  FRUGAL_CHECK(lse.shape() == Shape({batch, s.n_heads, s.q_len}), "attention_block_backward lse ",
               shape_string(lse.shape()), " for q ", shape_string(q.shape()), " batch ", batch);
#ifdef FRUGAL_HAVE_CUDA
  if (device == Device::cuda) return gpu::attention_accumulate_backward(dq, dk, dv, dout, q, k, v, out, lse, s);
#endif
  cpu::attention_backward(dq.data<float>(), dk.data<float>(), dv.data<float>(), dout.data<float>(),
                          q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                          lse.data<float>(), s);
}

}  // namespace frugal::ops
