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
                              const Tensor& lse, int64_t batch, int64_t causal_offset,
                              int64_t window, const BlockDocuments& documents) {
  // On the CPU every tensor is f32; on a GPU the inputs are bf16 and dq, dk, dv, lse fp32.
  const Device device = q.defined() ? q.device() : Device::cpu;
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dq, &dk, &dv, &lse})
    FRUGAL_CHECK(
        t->defined() && t->device() == device && t->dtype() == DType::f32,
        "attention_block_backward: the gradients and lse must be f32 on the inputs' device");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dout, &q, &k, &v, &out})
    FRUGAL_CHECK(t->defined() && t->device() == device && t->dtype() == compute_dtype(device),
                 "attention_block_backward inputs must be ", dtype_name(compute_dtype(device)),
                 " tensors of one device");
  cpu::AttentionShape s =
      attention_shape(q, k, batch, causal_offset, window, "attention_block_backward");
  s.documents = block_document_mask(documents, q, k, "attention_block_backward");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dq, &dout, &out})
    FRUGAL_CHECK(t->shape() == q.shape(), "attention_block_backward: ", shape_string(t->shape()),
                 " against query ", shape_string(q.shape()));
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dk, &dv, &v})
    FRUGAL_CHECK(t->shape() == k.shape(), "attention_block_backward: ", shape_string(t->shape()),
                 " against key ", shape_string(k.shape()));
  FRUGAL_CHECK(lse.shape() == Shape({batch, s.n_heads, s.q_len}), "attention_block_backward lse ",
               shape_string(lse.shape()), " for q ", shape_string(q.shape()), " batch ", batch);
#ifdef FRUGAL_HAVE_CUDA
  if (device == Device::cuda)
    return gpu::attention_accumulate_backward(dq, dk, dv, dout, q, k, v, out, lse, s);
#endif
  cpu::attention_backward(dq.data<float>(), dk.data<float>(), dv.data<float>(), dout.data<float>(),
                          q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                          lse.data<float>(), s);
}

}  // namespace frugal::ops
