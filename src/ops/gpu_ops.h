// The CUDA side of ops/: the same operations as ops.h for tensors in device memory, with the
// shapes already checked by ops.cpp. Internal to ops/ (ops.cpp dispatches here).
#pragma once

#ifdef FRUGAL_HAVE_CUDA

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/fp8.h"
#include "ops/ops.h"

namespace frugal::ops::gpu {

void bind(DeviceContext* context);
Arena& compute_arena();

Tensor zeros(const Shape& shape, DType dtype, Arena& arena);
void copy(Tensor& dst, const Tensor& src);
Tensor convert(const Tensor& src, DType dtype, Arena& arena);
void convert_into(Tensor& dst, const Tensor& src);
Tensor to_host_f32(const Tensor& src);
// Queues dst = src on the communication stream after the compute stream's work so far; returns
// an event recorded after it (opaque: a CUevent_st* owned by the caller, see event_*).
void* copy_beside(Tensor& dst, const Tensor& src);
void event_wait(void* event);  // the compute stream waits for it
void event_done(void* event);  // the host waits for it
void event_release(void* event);
// Queues `fn` on the communication stream (cudaLaunchHostFunc): CUDA's callback thread runs it
// when the stream gets there. It must not call CUDA.
void call_on_comm_stream(std::function<void()> fn);
// Whether a GPU is bound (bind); a caching page-locked host arena of its own.
bool has_device();
std::unique_ptr<Arena> pinned_host_arena(std::string name);

Tensor embedding(const Tensor& tokens, const Tensor& table);
void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens);
Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor* rstd);
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        Tensor& dw, const Tensor& dresidual, GradWrite dw_write);
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& residual);
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                       Tensor* dx_sum, GradWrite dw_write);
Tensor rope(const Tensor& x, const Tensor& positions, const RotaryFrequencies& rotary,
            bool backward);
Attention attention(const Tensor& q, const Tensor& k, const Tensor& v,
                    const cpu::AttentionShape& shape);
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Attention& fwd,
                                  const cpu::AttentionShape& shape);
// dq, dk, dv (fp32) += the block's gradients; out and lse the merged ones (ring attention).
void attention_accumulate_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                                   const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse,
                                   const cpu::AttentionShape& shape);
void merge_attention(Tensor& out, Tensor& lse, const Attention& part, int64_t batch);
Tensor dropout(const Tensor& x, float p, uint64_t seed, int64_t first);
Tensor swiglu(const Tensor& g, const Tensor& u);
void add_bias(Tensor& x, const Tensor& b);
void bias_backward(const Tensor& dy, Tensor& db);
SwigluGrads swiglu_backward(const Tensor& dh, const Tensor& g, const Tensor& u);

Tensor loss_accumulator();
void cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor* dlogits,
                   Tensor& loss_sum);
double read_loss(const Tensor& loss_sum);

void add_inplace(Tensor& y, const Tensor& x);
void scale_inplace(Tensor& y, float s);
void zero(Tensor& t);
int64_t normal_rows(Tensor& rows, int64_t n_rows, int64_t row_len, uint64_t key, int64_t first_row,
                    float std);
int64_t nf4_first_level(const Tensor& w, int64_t blocks, Tensor& codes, Tensor& absmax,
                        const float* midpoints);
void dequantize_nf4(Tensor& out, const Tensor& codes, const Tensor& absmax_codes,
                    const Tensor& scales, float offset, const float* nf4_table,
                    const float* absmax_map);
void dequantize_hqq(Tensor& out, const Tensor& codes, const Tensor& scales, const Tensor& zeros);
double sum_squares(const std::vector<Tensor>& xs);
std::vector<GradHealth> grad_health(const std::vector<Tensor>& xs);
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s,
                  Tensor& param_copy, const Bf16Store& store);

Fp8Cast fp8_cast(const Tensor& x, const Fp8Slot& slot, bool plain, bool transposed);
Fp8Cast fp8_cast(const Nf4Parts& w, int64_t rows, int64_t cols, const Fp8Slot& slot, bool plain,
                 bool transposed);
Fp8Cast fp8_cast(const HqqParts& w, int64_t rows, int64_t cols, const Fp8Slot& slot, bool plain,
                 bool transposed);
Tensor fp8_gemm(const Fp8Matrix& a, const Fp8Matrix& b, bool fast_accumulation);
void fp8_gemm_accumulate(Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b,
                         bool fast_accumulation);
void dequantize_fp8(Tensor& out, const Tensor& codes, const Tensor& scale_inv, Fp8Format format);
Tensor fp8_transpose_codes(const Tensor& codes);
void fp8_delayed_update(Tensor& history, Tensor& scale, Tensor& scale_inv, const Tensor& max_values,
                        int margin);

void matmul(Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, int64_t m,
            int64_t n, int64_t k, float alpha, float beta, MatmulPrecision precision);
void galore_moments(Tensor& m, Tensor& v, Tensor& r, float beta1, float beta2, float eps);
void adamw_int8_update(Tensor& param, const Tensor& grad, QuantizedMoment& m, QuantizedMoment& v,
                       const AdamWStep& s, Tensor& param_copy, const Bf16Store& store);
void galore_moments_int8(QuantizedMoment& m, QuantizedMoment& v, Tensor& r, float beta1,
                         float beta2, float eps);
void quantize_moment(QuantizedMoment& q, const Tensor& x, bool is_signed);
void dequantize_moment(Tensor& x, const QuantizedMoment& q, bool is_signed);
void galore_apply(Tensor& param, const Tensor& delta, float step, float decay, Tensor& param_copy,
                  const Bf16Store& store);
void galore_sketch(Tensor& omega, uint64_t seed);
// A timing event recorded on the compute stream (a core/device.h Event), and the milliseconds
// from one to another (waits for the later one).
std::shared_ptr<void> record_timing_event();
double elapsed_ms(const std::shared_ptr<void>& start, const std::shared_ptr<void>& end);

}  // namespace frugal::ops::gpu

#endif  // FRUGAL_HAVE_CUDA
