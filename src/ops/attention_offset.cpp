// Shape checks and dispatch for attention_block (attention_offset.h).
#include "ops/attention_offset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention.h"
#include "ops/gpu_ops.h"
#include "ops/ops.h"

namespace frugal::ops {

cpu::DocumentMask block_document_mask(const BlockDocuments& documents, const Tensor& q,
                                      const Tensor& k, const char* what) {
  if (!documents.defined()) return {};
  auto check = [&](const Tensor& bounds, const Tensor& rows, const char* which) {
    FRUGAL_CHECK(bounds.defined() && bounds.dtype() == DType::i32 && bounds.ndim() == 1 &&
                     bounds.size(0) == rows.size(0) && bounds.device() == rows.device(),
                 what, ": the ", which, " document bounds must be i32 [", rows.size(0),
                 "] on the device of the rows");
  };
  check(documents.query_doc_start, q, "query");
  check(documents.key_doc_end, k, "key");
  cpu::DocumentMask m;
  m.query_doc_start = documents.query_doc_start.data<int32_t>();
  m.key_doc_end = documents.key_doc_end.data<int32_t>();
  m.key_position0 = documents.key_position0;
  return m;
}

Attention attention_block(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch,
                          int64_t causal_offset, int64_t window, const BlockDocuments& documents) {
  const Device device = q.defined() ? q.device() : Device::cpu;
  for (const Tensor* t : {&q, &k, &v}) {
    FRUGAL_CHECK(t->defined() && t->device() == device && t->dtype() == compute_dtype(device),
                 "attention_block inputs must be ", dtype_name(compute_dtype(device)),
                 " tensors of one device");
    FRUGAL_CHECK(t->ndim() == 3, "attention_block input ", shape_string(t->shape()));
  }
  FRUGAL_CHECK(v.shape() == k.shape(), "attention_block value ", shape_string(v.shape()),
               " against key ", shape_string(k.shape()));
  cpu::AttentionShape s = attention_shape(q, k, batch, causal_offset, window, "attention_block");
  s.documents = block_document_mask(documents, q, k, "attention_block");
#ifdef FRUGAL_HAVE_CUDA
  if (device == Device::cuda) return gpu::attention(q, k, v, s);
#endif
  Attention a{Tensor::empty(q.shape(), DType::f32, q.arena()),
              Tensor::empty({batch, s.n_heads, s.q_len}, DType::f32, q.arena())};
  cpu::attention_forward(a.out.data<float>(), a.lse.data<float>(), q.data<float>(), k.data<float>(),
                         v.data<float>(), s);
  return a;
}

void merge_attention(Tensor& out, Tensor& lse, const Attention& part, int64_t batch) {
  FRUGAL_CHECK(out.dtype() == DType::f32 && lse.dtype() == DType::f32 && out.ndim() == 3 &&
                   part.out.shape() == out.shape() && part.lse.shape() == lse.shape() &&
                   out.device() == lse.device() && part.out.device() == out.device() && batch > 0 &&
                   out.size(0) % batch == 0 &&
                   lse.shape() == Shape({batch, out.size(1), out.size(0) / batch}),
               "merge_attention of out ", shape_string(out.shape()), " lse ",
               shape_string(lse.shape()), " with a part ", shape_string(part.out.shape()));
#ifdef FRUGAL_HAVE_CUDA
  if (out.device() == Device::cuda) return gpu::merge_attention(out, lse, part, batch);
#endif
  const int64_t H = out.size(1), D = out.size(2), T = out.size(0) / batch;
  float* o = out.data<float>();
  float* l = lse.data<float>();
  const float* po = part.out.data<float>();
  const float* pl = part.lse.data<float>();
  const float neg_inf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const int64_t li = (b * H + h) * T + i;
        const float lse_new = pl[li];
        if (lse_new == neg_inf) continue;
        const float lse_old = l[li];
        float* o_row = o + ((b * T + i) * H + h) * D;
        const float* p_row = po + ((b * T + i) * H + h) * D;
        if (lse_old == neg_inf) {
          std::memcpy(o_row, p_row, size_t(D) * sizeof(float));
          l[li] = lse_new;
          continue;
        }
        const float m = std::max(lse_old, lse_new);
        const float lse_sum = m + std::log(std::exp(lse_old - m) + std::exp(lse_new - m));
        const float w_old = std::exp(lse_old - lse_sum), w_new = std::exp(lse_new - lse_sum);
        for (int64_t d = 0; d < D; ++d) o_row[d] = w_old * o_row[d] + w_new * p_row[d];
        l[li] = lse_sum;
      }
    }
  }
}

}  // namespace frugal::ops
