// Shape checks and dispatch for attention_block (attention_offset.h).
#include "ops/attention_offset.h"

#include <cmath>

#include "kernels/cpu/attention.h"

namespace frugal::ops {

Attention attention_block(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch,
                          int64_t causal_offset) {
  for (const Tensor* t : {&q, &k, &v}) {
    FRUGAL_CHECK(t->defined() && t->device() == Device::cpu && t->dtype() == DType::f32,
                 "attention_block input must be an f32 cpu tensor");
    FRUGAL_CHECK(t->ndim() == 3, "attention_block input ", shape_string(t->shape()));
  }
  FRUGAL_CHECK(v.shape() == k.shape(), "attention_block value ", shape_string(v.shape()),
               " against key ", shape_string(k.shape()));
  FRUGAL_CHECK(batch > 0 && q.size(0) % batch == 0 && k.size(0) % batch == 0 &&
                   q.size(2) == k.size(2) && q.size(1) % k.size(1) == 0 && causal_offset >= 0,
               "attention_block q ", shape_string(q.shape()), " k ", shape_string(k.shape()),
               " batch ", batch, " causal_offset ", causal_offset);
  cpu::AttentionShape s;
  s.batch = batch;
  s.q_len = q.size(0) / batch;
  s.kv_len = k.size(0) / batch;
  s.n_heads = q.size(1);
  s.n_kv_heads = k.size(1);
  s.head_dim = q.size(2);
  s.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));  // as ops::attention
  s.causal_offset = causal_offset;
  Attention a{Tensor::empty(q.shape(), DType::f32, q.arena()),
              Tensor::empty({batch, s.n_heads, s.q_len}, DType::f32, q.arena())};
  cpu::attention_forward(a.out.data<float>(), a.lse.data<float>(), q.data<float>(), k.data<float>(),
                         v.data<float>(), s);
  return a;
}

}  // namespace frugal::ops
