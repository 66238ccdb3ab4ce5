// AdamW exactly as torch.optim.AdamW computes it (single-tensor path), and the sum of squares
// for global-norm gradient clipping (with the counts of the health monitor).
#include "kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace frugal::cpu {

namespace {

// The per-element update (the scalars folded by adamw_scalars) on elements [begin, end): no
// branch in the loop, so that it vectorizes; kCopy: also write the bf16 copy.
template <bool kCopy>
inline __attribute__((always_inline)) void update_range(
    float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ m,
    float* __restrict__ v, uint16_t* __restrict__ param_bf16, int64_t begin, int64_t end,
    const AdamWScalars& c) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = grad[i] * c.grad_scale;
    float p = param[i] * c.decay;                              // param.mul_(1 - lr * wd)
    const float mi = m[i] + c.one_minus_b1 * (g - m[i]);       // exp_avg.lerp_(grad, 1 - b1)
    const float vi = v[i] * c.beta2 + c.one_minus_b2 * g * g;  // exp_avg_sq.mul_(b2).addcmul_
    const float denom = std::sqrt(vi) / c.bias_correction2_sqrt + c.eps;
    p -= c.step_size * (mi / denom);  // param.addcdiv_(exp_avg, denom, -step_size)
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
    if constexpr (kCopy) param_bf16[i] = float_to_bf16(p);
  }
}

// The host AdamW of offload = optimizer is bound by this arithmetic (on a 32-core Xeon, 8, 16
// and 32 threads gave 7.0k, 11.3k and 14.8k tokens/s for a 1.1B model): on x86-64 with GCC
// the loops are also compiled for AVX2 and AVX-512, the best one chosen when the program loads
// (target_clones). Built with -ffp-contract=off (CMakeLists.txt: AVX-512 implies FMA, which GCC
// would otherwise use), every version computes the same bits.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define FRUGAL_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FRUGAL_VECTOR_CLONES
#endif

FRUGAL_VECTOR_CLONES void update_plain(float* param, const float* grad, float* m, float* v,
                                       int64_t begin, int64_t end, const AdamWScalars& c) {
  update_range<false>(param, grad, m, v, nullptr, begin, end, c);
}

FRUGAL_VECTOR_CLONES void update_with_copy(float* param, const float* grad, float* m, float* v,
                                           uint16_t* param_bf16, int64_t begin, int64_t end,
                                           const AdamWScalars& c) {
  update_range<true>(param, grad, m, v, param_bf16, begin, end, c);
}

}  // namespace

namespace {

inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return bf16_to_float(x); }
inline void narrow(float& dst, float x) { dst = x; }
inline void narrow(uint16_t& dst, float x) { dst = bf16_round_nearest(x); }

// The bf16 master's update: update_range's arithmetic on the widened values, the weight stored
// by `store`, moments of type Moment (fp32, or bf16 rounded to nearest).
template <class Moment>
void update_bf16_range(uint16_t* __restrict__ param, const uint16_t* __restrict__ grad,
                       Moment* __restrict__ m, Moment* __restrict__ v, int64_t begin, int64_t end,
                       const AdamWScalars& c, const Bf16Store& store) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = bf16_to_float(grad[i]) * c.grad_scale;
    float p = bf16_to_float(param[i]) * c.decay;
    const float m_old = widen(m[i]), v_old = widen(v[i]);
    const float mi = m_old + c.one_minus_b1 * (g - m_old);
    const float vi = v_old * c.beta2 + c.one_minus_b2 * g * g;
    const float denom = std::sqrt(vi) / c.bias_correction2_sqrt + c.eps;
    p -= c.step_size * (mi / denom);
    narrow(m[i], mi);
    narrow(v[i], vi);
    param[i] = bf16_store(p, store, i);
  }
}

template <class Moment>
void update_bf16(uint16_t* param, const uint16_t* grad, Moment* m, Moment* v, int64_t n,
                 const AdamWStep& s, const Bf16Store& store) {
  const AdamWScalars c = adamw_scalars(s);
  constexpr int64_t kBlock = 1 << 14;
  const int64_t n_blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n_blocks > 1)
  for (int64_t b = 0; b < n_blocks; ++b)
    update_bf16_range(param, grad, m, v, b * kBlock, std::min(n, (b + 1) * kBlock), c, store);
}

}  // namespace

void adamw_update_bf16(uint16_t* param, const uint16_t* grad, float* m, float* v, int64_t n,
                       const AdamWStep& s, const Bf16Store& store) {
  update_bf16(param, grad, m, v, n, s, store);
}

void adamw_update_bf16(uint16_t* param, const uint16_t* grad, uint16_t* m, uint16_t* v, int64_t n,
                       const AdamWStep& s, const Bf16Store& store) {
  update_bf16(param, grad, m, v, n, s, store);
}

AdamWScalars adamw_scalars(const AdamWStep& s) {
  FRUGAL_CHECK(s.step >= 1, "adamw step is 1-based, got ", s.step);
  // The scalars are computed in double, as Python does in torch's _single_tensor_adamw, then
  // enter the fp32 element math as floats.
  const double lr = s.lr, b1 = s.beta1, b2 = s.beta2;
  const double bias_correction1 = 1.0 - std::pow(b1, static_cast<double>(s.step));
  const double bias_correction2 = 1.0 - std::pow(b2, static_cast<double>(s.step));
  AdamWScalars c;
  c.decay = static_cast<float>(1.0 - lr * static_cast<double>(s.weight_decay));
  c.one_minus_b1 = static_cast<float>(1.0 - b1);
  c.one_minus_b2 = static_cast<float>(1.0 - b2);
  c.beta2 = s.beta2;
  c.step_size = static_cast<float>(lr / bias_correction1);
  c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = s.eps;
  c.grad_scale = s.grad_scale;
  return c;
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWStep& s, uint16_t* param_bf16) {
  const AdamWScalars c = adamw_scalars(s);
  // Blocks of elements over the threads, each block one call of the vectorized loop.
  constexpr int64_t kBlock = 1 << 14;
  const int64_t n_blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n_blocks > 1)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
    if (param_bf16)
      update_with_copy(param, grad, m, v, param_bf16, begin, end, c);
    else
      update_plain(param, grad, m, v, begin, end, c);
  }
}

namespace {

// The bf16 rounding of |x| (bits u, sign cleared) is zero or subnormal below 0x007F8000 (at that
// tie, round-to-nearest-even goes up to the smallest normal, 0x0080), and infinite from
// 0x7F7F8000 (the tie between the largest finite bf16, 0x7F7F, and inf rounds to even: inf).
constexpr uint32_t kBf16UnderflowBelow = 0x007F8000u;
constexpr uint32_t kBf16OverflowFrom = 0x7F7F8000u;
constexpr uint32_t kF32Inf = 0x7F800000u;

// Fixed-size chunks summed in chunk order, each in kLanes interleaved partial sums added in lane
// order: the same result for any thread count, and a loop the compiler vectorizes (one running
// sum would be a chain it may not reorder). kCount: also count, per chunk while it is in cache,
// the non-finite values and those a bf16 cast would underflow or overflow; the sum is the same
// code either way, so grad_health's sum equals sum_squares' bit for bit.
template <bool kCount>
GradHealthCounts sum_squares_chunks(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  constexpr int kLanes = 8;
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  std::vector<GradHealthCounts> partial(static_cast<size_t>(n_chunks));
#pragma omp parallel for schedule(static) if (n_chunks > 1)
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    double lanes[kLanes] = {};
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(x[i + l]) * x[i + l];
    for (; i < end; ++i) lanes[0] += static_cast<double>(x[i]) * x[i];
    double acc = 0.0;
    for (double lane : lanes) acc += lane;
    GradHealthCounts& p = partial[static_cast<size_t>(c)];
    p.sum_squares = acc;
    if constexpr (kCount) {
      int64_t nonfinite = 0, underflow = 0, overflow = 0;
      for (int64_t j = begin; j < end; ++j) {
        uint32_t u;
        std::memcpy(&u, x + j, sizeof u);
        u &= 0x7FFFFFFFu;
        nonfinite += u >= kF32Inf;
        underflow += u != 0 && u < kBf16UnderflowBelow;
        overflow += u >= kBf16OverflowFrom && u < kF32Inf;
      }
      p.nonfinite = nonfinite;
      p.bf16_underflow = underflow;
      p.bf16_overflow = overflow;
    }
  }
  GradHealthCounts total;
  for (const GradHealthCounts& p : partial) {
    total.sum_squares += p.sum_squares;
    total.nonfinite += p.nonfinite;
    total.bf16_underflow += p.bf16_underflow;
    total.bf16_overflow += p.bf16_overflow;
  }
  return total;
}

}  // namespace

double sum_squares(const float* x, int64_t n) {
  return sum_squares_chunks<false>(x, n).sum_squares;
}

GradHealthCounts grad_health(const float* x, int64_t n) { return sum_squares_chunks<true>(x, n); }

}  // namespace frugal::cpu
