// The operations the model is written in: each takes and returns Tensors, checks shapes, and
// dispatches on the tensor's device to a kernel (kernels/cpu or kernels/cuda). Model code
// never sees a kernel or a device API.
//
// Dtypes by device: on the CPU everything is f32 but the bf16 master weights and gradient
// shards of optim.master_dtype = bf16 (and their bf16 moments), which the optimizer's
// operations, add_inplace, sum_squares and grad_health take. On a GPU activations and the gathered
// weights the layers read are bf16 (math in fp32 inside the kernels), while weight gradients,
// master weights and optimizer state are f32 (bf16 with optim.state_dtype = bf16, where
// linear_backward and rmsnorm_backward also add into bf16 weight gradients, one rounding per
// call); the attention gradients come back in bf16.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "ops/grad_write.h"

namespace frugal {
class DeviceContext;
}

namespace frugal::ops {

// --- devices --------------------------------------------------------------------------------
// Operations on CUDA tensors run on this context's compute stream, and their results live in
// its device memory. A process drives one GPU: the trainer binds it once (nullptr unbinds).
// Throws in a build without CUDA.
void bind_device(DeviceContext* context);
// The dtype of activations and of gathered weights on a device: f32 on the CPU, bf16 on a GPU.
DType compute_dtype(Device device);

// Choices between kernels, set once at start-up before any operation runs and handed to the
// kernels as arguments: kernels/ reads no environment. The app reads them from the environment
// (kernel_options_from_environment); tests and tools may set them directly.
struct KernelOptions {
  // GPU attention on the Hopper kernels (kernels/cuda/flash_attention_sm90.cu) where they
  // apply; false keeps the FlashAttention-2 ones, e.g. to compare them.
  bool attention_sm90 = true;
};
void set_kernel_options(const KernelOptions& options);
const KernelOptions& kernel_options();
// The options the environment asks for, given FRUGAL_ATTENTION_SM90's value (nullptr: unset):
// 0 or 1 (the default); any other value is an Error naming the variable.
KernelOptions kernel_options_from_environment(const char* attention_sm90);

// A tensor in the compute memory of `like`'s device (its arena when that is the CPU's).
Tensor empty_like(const Tensor& like, const Shape& shape, DType dtype);
// Zeros in any arena (device memory is cleared on the compute stream).
Tensor zeros(const Shape& shape, DType dtype, Arena& arena);
// dst = src: same shape and dtype, any devices (ordered on the compute stream).
void copy(Tensor& dst, const Tensor& src);
// src in `arena` converted to dtype (f32 <-> bf16; a plain copy when the dtype is the same).
Tensor convert(const Tensor& src, DType dtype, Arena& arena);
// dst = src converted to dst's dtype (f32 <-> bf16), both on one device, same shape.
void convert_into(Tensor& dst, const Tensor& src);
// dst = src converted to dst's dtype (f32 <-> bf16), any devices (fp32 checkpoint rows into the
// bf16 shards of a bf16 run); ops::copy when the dtypes agree.
void assign(Tensor& dst, const Tensor& src);
// src on the device of `like` (src itself when it is already there).
Tensor on_device_of(const Tensor& src, const Tensor& like);
// An f32 copy in host memory, complete on return (waits for the GPU).
Tensor to_host_f32(const Tensor& src);
// A copy that runs beside the compute stream (on the GPU's communication stream, after the
// work queued on the compute stream so far), so that moving offloaded state to and from pinned
// host memory overlaps the kernels. wait() orders the compute stream after it; done() blocks
// the host until it is finished. Both tensors are kept alive until then. Between host tensors
// it is an ordinary copy, finished on return. Its host side belongs in page-locked memory
// (side_copy_host_arena): CUDA copies into pageable memory synchronously, so the constructor
// would wait for the GPU to drain everything queued before it.
class SideCopy {
 public:
  SideCopy();
  SideCopy(Tensor& dst, const Tensor& src);
  ~SideCopy();
  SideCopy(SideCopy&&) noexcept;
  SideCopy& operator=(SideCopy&&) noexcept;
  void wait();
  void done();
  bool on_gpu() const;  // whether it runs on the GPU's communication stream

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Calls `then` once every one of `copies` has finished, without the caller waiting: on a GPU
// from CUDA's callback thread when the communication stream (where side copies run) reaches
// it, so `then` must not call CUDA or ops (it may hand work to a thread of its own); host-only
// copies are finished already, and `then` runs here. The copies stay with the caller, who must
// keep them (and what they copy) alive until `then` has run.
void after_side_copies(const std::vector<SideCopy>& copies, std::function<void()> then);
// A host arena for temporaries that side copies fill or read: page-locked (caching) when a GPU
// is bound (bind_device), so that copies to and from it run beside the kernels instead of
// blocking the host; a plain host arena otherwise.
std::unique_ptr<Arena> side_copy_host_arena(std::string name);

// --- layers -----------------------------------------------------------------------------
// tokens [T] i32, table [V, H] -> [T, H]
Tensor embedding(const Tensor& tokens, const Tensor& table);
void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens);  // +=

// x [T, H], w [H] -> y [T, H]; rstd [T] saved when not null
Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor* rstd);
// returns dx, plus dresidual when it is defined (the gradient that reaches x through the
// residual path, added in the same pass); dw accumulated, or overwritten (dw_write; on a GPU f32
// or bf16)
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                        Tensor& dw, const Tensor& dresidual = Tensor(),
                        GradWrite dw_write = GradWrite::kAdd);

// x [T, K], w [N, K] (Hugging Face layout) -> x w^T [T, N], plus residual [T, N] when it is
// defined (on a GPU in the GEMM's epilogue: the residual stream's add costs no pass of its own)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& residual = Tensor());
// returns dx; dw accumulated, or overwritten (dw_write; on a GPU f32 or bf16; undefined for a
// frozen weight). With dx_sum, dx is added into *dx_sum (on a GPU by the GEMM itself) and *dx_sum
// is returned: the input gradient of projections that share their input, without a separate add
// per projection.
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                       Tensor* dx_sum = nullptr, GradWrite dw_write = GradWrite::kAdd);

// What a rotary embedding rotates by: pair i of a token at position p turns by the float angle
// p * inv_freq[i] (head_dim / 2 entries), and cos, sin are multiplied by attention_scaling
// (YaRN's attention factor; 1 otherwise). model/rope_scaling.h makes them from the config.
struct RotaryFrequencies {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};
// x [T, heads, head_dim] rotated by positions [T] (i32); returns a new tensor
Tensor rope(const Tensor& x, const Tensor& positions, const RotaryFrequencies& rotary);
Tensor rope_backward(const Tensor& dy, const Tensor& positions, const RotaryFrequencies& rotary);

struct Attention {
  Tensor out;  // [B*S, n_heads, head_dim]
  Tensor lse;  // [B, n_heads, S]
};
// Packed documents (data.packing = documents), per token of a micro-batch: where its document
// starts and ends, as positions in its sequence (the window). Attention stays inside each
// document (cpu::DocumentMask). i32 [B*S] each, on the device of the activations; undefined:
// one document per sequence.
struct DocumentBounds {
  Tensor start;  // position of the first token of the token's document
  Tensor end;    // position one past its last token
  bool defined() const { return start.defined(); }
};

// The kernels' description of attention of q [B*Sq, n_heads, D] against k [B*Skv, n_kv_heads,
// D] with a causal offset (query i sees key j iff j <= i + causal_offset) and a sliding window
// (> 0: also i + causal_offset - j < window; 0: none), scale 1/sqrt(D); throws naming `what`
// and the shapes when they do not fit together.
cpu::AttentionShape attention_shape(const Tensor& q, const Tensor& k, int64_t batch,
                                    int64_t causal_offset, int64_t window, const char* what);
// q [B*S, n_heads, D], k, v [B*S, n_kv_heads, D]; causal within each of the B sequences, and
// with window > 0 (Mistral's sliding window) query i sees only keys i - window < j <= i.
// With `documents` defined, query i sees only keys of its own document.
Attention attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch,
                    int64_t window = 0, const DocumentBounds& documents = {});
struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Attention& fwd, int64_t batch,
                                  int64_t window = 0, const DocumentBounds& documents = {});

// Inverted dropout with probability p of dropping, its mask a pure function of (seed, element
// index) (kernels/dropout_mask.h): the backward is dropout(dy, p, seed) with the same seed.
// `first` is the index of x's first element in a larger tensor whose rows x is (a chunk of
// rows draws the mask those rows have in the whole).
Tensor dropout(const Tensor& x, float p, uint64_t seed, int64_t first = 0);

// silu(g) * u
Tensor swiglu(const Tensor& g, const Tensor& u);
struct SwigluGrads {
  Tensor dg, du;
};
SwigluGrads swiglu_backward(const Tensor& dh, const Tensor& g, const Tensor& u);

// --- loss ---------------------------------------------------------------------------------
// A loss sum on the device of `like` ([1], zero): chunks of rows add into it on the device,
// and it is read once at the end, so a GPU is not stalled once per chunk.
Tensor loss_accumulator(const Tensor& like);
// loss_sum += the sum over counted rows (targets >= 0) of -log softmax(logits)[target]. When
// dlogits is not null it receives grad_scale * d(sum)/d(logits).
void cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor* dlogits,
                   Tensor& loss_sum);
// The value of an accumulator (waits for the GPU); reports target ids outside the vocabulary.
double read_loss(const Tensor& loss_sum);

// x [T, N] += b [N] on every row (a projection's bias); db [N] += the sum of dy's rows (f32).
void add_bias(Tensor& x, const Tensor& b);
void bias_backward(const Tensor& dy, Tensor& db);

// --- elementwise --------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
void add_inplace(Tensor& y, const Tensor& x);
void scale_inplace(Tensor& y, float s);
void zero(Tensor& t);
// The sum of squares of every element of every tensor (f32), in order: one wait for a GPU.
double sum_squares(const std::vector<Tensor>& xs);

// The health monitor's pass over gradients (f32, or bf16 on a GPU), one result per tensor: its
// sum of squares (summed in order, they give sum_squares(xs) bit for bit, so a log step's norm
// is the norm of any step), its non-finite values, and the finite values a cast to bf16 would
// make zero or subnormal (underflow) or inf (overflow). One wait for a GPU.
struct GradHealth {
  double sum_squares = 0;
  int64_t nonfinite = 0;
  int64_t bf16_underflow = 0;
  int64_t bf16_overflow = 0;
  int64_t count = 0;  // elements
};
std::vector<GradHealth> grad_health(const std::vector<Tensor>& xs);

// --- seeded initialisation and quantized weights ----------------------------------------
// rows (f32 [n, ...], either device) = rows first_row .. first_row + n - 1 of a weight drawn from
// normal(0, std) by the streams of `key` (kernels/normal_init.h, model's init_row_key): the same
// numbers on both devices, bit for bit. Returns how many values the host made for a GPU (those
// whose fp32 rounding the GPU's libm could change, about 1 in 10^5; 0 on the CPU).
int64_t normal_rows(Tensor& rows, uint64_t key, int64_t first_row, float std);

// NF4's first level (quant/nf4.h) of the first `blocks` blocks of 64 of w (f32) into codes (u8,
// at least blocks * 32) and absmax (f32, at least blocks), all on one device, the same bytes on
// both; midpoints: nf4_midpoints(). Returns the first block holding inf or NaN, or `blocks`.
int64_t nf4_first_level(const Tensor& w, int64_t blocks, Tensor& codes, Tensor& absmax,
                        const float* midpoints);

// NF4 (quant/nf4.h's format) dequantized into out (numel n, a multiple of 64): f32 on the CPU,
// bf16 on a GPU. codes u8 [n / 2], absmax_codes u8 [n / 64], scales f32 [ceil(n / 16384)] on
// out's device; the tables are host arrays (nf4_values(), dynamic_map_values()).
void dequantize_nf4(Tensor& out, const Tensor& codes, const Tensor& absmax_codes,
                    const Tensor& scales, float offset, const float* nf4_table,
                    const float* absmax_map);

// HQQ 4-bit (quant/hqq.h's format) dequantized into out likewise: codes u8 [n / 2], scales and
// zeros f32 [n / 64], on out's device.
void dequantize_hqq(Tensor& out, const Tensor& codes, const Tensor& scales, const Tensor& zeros);

// --- optimizer ----------------------------------------------------------------------------
using AdamWStep = cpu::AdamWStep;
// One AdamW update of param with grad, moments m and v (all the same shape, f32). When
// param_copy is defined (bf16, same shape) it receives the updated values in its dtype: the
// copy the forward reads on a GPU. A bf16 master (optim.master_dtype = bf16): param and grad
// bf16, m and v bf16 or f32, each updated weight stored into param as `store` says
// (stochastically or to nearest; kernels/stochastic_rounding.h), on either device.
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s,
                  Tensor param_copy = Tensor(), const Bf16Store& store = Bf16Store());

// 8-bit optimizer state (optim.state_dtype = int8; kernels/blockwise_int8.h): one moment of a
// 2-D tensor [rows, cols] as codes (u8, that shape), indices into bitsandbytes' dynamic map
// (signed for the first moment, unsigned for the second), and absmax (f32 [rows, ceil(cols /
// block)]), the scale of each block of `block` consecutive values within a row. Blocks never
// cross rows, so a ZeRO-3 row shard holds whole blocks: where cols is a multiple of the block
// they are bitsandbytes' flat blocks.
struct QuantizedMoment {
  Tensor codes, absmax;
  int64_t block = 256;
};
// A zero moment (codes 0, absmax 0: every value 0) of a [rows, cols] tensor in `arena`.
QuantizedMoment quantized_moment_zeros(int64_t rows, int64_t cols, int64_t block, Arena& arena);
// One AdamW step with 8-bit moments in one pass over each block (dequantize, update the
// moments and the weight, requantize): bitsandbytes' AdamW8bit. param and grad are f32 (a bf16
// param_copy optional, as adamw_update) or both bf16 (bf16 master weights).
void adamw_int8_update(Tensor& param, const Tensor& grad, QuantizedMoment& m, QuantizedMoment& v,
                       const AdamWStep& s, Tensor param_copy = Tensor(),
                       const Bf16Store& store = Bf16Store());
// galore_moments with 8-bit moments: r (f32, [rows, cols]) moves them and becomes
// m / (sqrt(v) + eps).
void galore_moments_int8(QuantizedMoment& m, QuantizedMoment& v, Tensor& r, float beta1,
                         float beta2, float eps);
// x (f32, [rows, cols]) into q, and q back into x (the first moment's signed map, or the
// second's unsigned one).
void quantize_moment(QuantizedMoment& q, const Tensor& x, bool is_signed);
void dequantize_moment(Tensor& x, const QuantizedMoment& q, bool is_signed);

// --- dense linear algebra (GaLore's projections) ---------------------------------------------
// How a GPU multiplies f32 matrices: in fp32, or on the tensor cores in TF32 (each operand
// rounded to 10 mantissa bits, the sums in fp32; several times faster). The CPU always
// multiplies in fp32.
enum class MatmulPrecision { fp32, tf32 };
// c = alpha * op(a) . op(b) + beta * c on one device, op(x) = x^T when its flag is set: op(a)
// [m, k], op(b) [k, n], c [m, n]. c is f32; a and b are both f32 (multiplied at `precision`)
// or both bf16 (the tensor cores' bf16 rate on a GPU; each product of two bf16 values is exact
// in fp32, so every device sums the same products, in fp32). With k = 0 (a shard without rows)
// the product is zero: c = beta * c.
void matmul(Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            float alpha = 1.0f, float beta = 0.0f,
            MatmulPrecision precision = MatmulPrecision::fp32);

// --- GaLore's elementwise steps (kernels/cpu/galore.h) ------------------------------------------
// On the projected gradient r (f32, the shape of m and v): Adam's moments, and r replaced by the
// normalized step m / (sqrt(v) + eps).
void galore_moments(Tensor& m, Tensor& v, Tensor& r, float beta1, float beta2, float eps);
// param = p + decay * p with p = param + step * delta (delta f32, param's shape); param_copy
// (optional, bf16) receives the result in its dtype. A bf16 param is stored as `store` says.
void galore_apply(Tensor& param, const Tensor& delta, float step, float decay,
                  Tensor param_copy = Tensor(), const Bf16Store& store = Bf16Store());
// The randomized projector's sketch (f32, any shape, contiguous): standard normal entries, each
// a function of the seed and its index alone (kernels/galore_sketch.h), drawn where omega lives.
void galore_sketch(Tensor& omega, uint64_t seed);

// --- timing ---------------------------------------------------------------------------------
// A mark in the stream of work on a device: the time between two marks is the time the device
// took for the work queued between them (CUDA timing events on the compute stream; on the CPU,
// where operations finish as they are called, the host clock). Reading waits for the later mark.
class TimeMark {
 public:
  TimeMark() = default;
  explicit TimeMark(Device device);  // recorded now
  double ms_since(const TimeMark& start) const;

 private:
  std::shared_ptr<void> event_;  // a timing Event on a GPU
  double host_s_ = 0;
};

}  // namespace frugal::ops
