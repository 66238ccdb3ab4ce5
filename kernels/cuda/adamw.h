// Multi-tensor AdamW on the GPU (torch.optim.AdamW's formula, as frugal::cpu::adamw_update) and
// the deterministic sum of squares for global-norm gradient clipping.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/adamw.h"
#include "kernels/stochastic_rounding.h"

namespace frugal::cuda {

// The same hyperparameters as the CPU backend (lr, betas, eps, weight decay, 1-based step,
// grad_scale), so an optimizer fills one struct for either.
using AdamWStep = frugal::cpu::AdamWStep;

// One tensor (or a piece of one) to update: n elements of fp32 param, grad, m and v in device
// memory; param_bf16, when not null, receives bf16(param) after the update (the copy the forward
// reads), saving a separate conversion pass.
struct AdamWChunk {
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  __nv_bfloat16* param_bf16 = nullptr;
  int64_t n = 0;
};

// One tensor of a bf16 run (optim.state_dtype = bf16): weight, gradient and moments all bf16,
// as a bf16 PyTorch model with torch.optim.AdamW keeps them. The element math is the fp32 one
// above on the widened values; each result is rounded to bf16 once: the moments to nearest
// even, the weight as `store` says (optim.bf16_rounding: stochastically or to nearest even,
// kernels/stochastic_rounding.h, the CPU's bits).
struct AdamWChunkBf16 {
  __nv_bfloat16* param = nullptr;
  const __nv_bfloat16* grad = nullptr;
  __nv_bfloat16* m = nullptr;
  __nv_bfloat16* v = nullptr;
  int64_t n = 0;
  Bf16Store store;
};

// One tensor with a bf16 master and fp32 moments (optim.master_dtype = bf16, state_dtype =
// fp32): weight and gradient bf16, the weight stored as `store` says.
struct AdamWChunkBf16Master {
  __nv_bfloat16* param = nullptr;
  const __nv_bfloat16* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
  Bf16Store store;
};

// Updates every chunk of the host array `chunks` with the same step (one param group); the
// chunk table travels as kernel arguments, one launch per kAdamWChunksPerLaunch chunks. The
// element math is frugal::cpu::adamw_update's, rounded identically (fp32, no fused
// multiply-add), so the results match the CPU bit for bit.
inline constexpr int kAdamWChunksPerLaunch = 48;
void adamw_update(const AdamWChunk* chunks, int64_t n_chunks, const AdamWStep& step,
                  cudaStream_t stream);
void adamw_update(const AdamWChunkBf16* chunks, int64_t n_chunks, const AdamWStep& step,
                  cudaStream_t stream);
void adamw_update(const AdamWChunkBf16Master* chunks, int64_t n_chunks, const AdamWStep& step,
                  cudaStream_t stream);

// Doubles of scratch sum_squares needs (its first-pass partial sums).
inline constexpr int64_t kSumSquaresScratch = 1024;

// *out = sum of x[i]^2 in fp64, or *out += that sum when accumulate is true (to sum a global
// norm over several tensors in a fixed order). out is a device pointer; scratch holds
// kSumSquaresScratch doubles. Deterministic: two passes with a fixed grid (depending on n only)
// and fixed-order reductions.
void sum_squares(double* out, const float* x, int64_t n, bool accumulate, double* scratch,
                 cudaStream_t stream);
void sum_squares(double* out, const __nv_bfloat16* x, int64_t n, bool accumulate, double* scratch,
                 cudaStream_t stream);

// One tensor of sum_squares_many: fp32 or bf16 values (exactly one pointer set), n of them.
struct SquaresChunk {
  const float* f32 = nullptr;
  const __nv_bfloat16* bf16 = nullptr;
  int64_t n = 0;
};
// Doubles of scratch sum_squares_many needs.
inline constexpr int64_t kSumSquaresManyScratch = 8192;
// *out = the sum of every chunk's x[i]^2 in fp64: the global norm of a step's gradients in a few
// launches instead of two per tensor (a 1.1B model has 201 tensors, most of them small, and the
// launches' gaps cost more than their work). Each chunk gets a fixed number of blocks (a
// function of its n), each block one partial in scratch (kSumSquaresManyScratch doubles), one
// block sums a launch's partials in order: the same bits on every run.
void sum_squares_many(double* out, const SquaresChunk* chunks, int64_t n_chunks, double* scratch,
                      cudaStream_t stream);

// The health monitor's pass (frugal::cpu::grad_health's twin): out[0] = sum_squares' value bit
// for bit (not accumulated), out[1] = non-finite values, out[2] / out[3] = finite values a bf16
// cast turns into zero or a subnormal / into inf (0 for bf16 input). out: kGradHealthValues
// device doubles; scratch: kGradHealthValues * kSumSquaresScratch doubles.
inline constexpr int kGradHealthValues = 4;
void grad_health(double* out, const float* x, int64_t n, double* scratch, cudaStream_t stream);
void grad_health(double* out, const __nv_bfloat16* x, int64_t n, double* scratch,
                 cudaStream_t stream);

}  // namespace frugal::cuda
