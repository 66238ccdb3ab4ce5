// cuBLASLt GEMMs for linear layers with Hugging Face's weight layout W [out, in] row-major:
// the forward y = x W^T and the two backward products, bf16 inputs with fp32 accumulation;
// and fp32 products of any two fp32 or bf16 operands (GaLore's projections).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "core/error.h"

namespace frugal::cuda {

// Throws frugal::Error when a cuBLAS(Lt) call does not return CUBLAS_STATUS_SUCCESS.
inline void check_cublas(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    ::frugal::fail("cuBLAS error: ", cublasLtGetStatusName(status), " (",
                   cublasLtGetStatusString(status), ") in ", what, " at ", file, ":", line);
}

}  // namespace frugal::cuda

// CUBLAS_CHECK(cublasLtMatmul(...)): throws frugal::Error on failure.
#define CUBLAS_CHECK(call) ::frugal::cuda::check_cublas((call), #call, __FILE__, __LINE__)

namespace frugal::cuda {

// Owns a cuBLASLt handle, one workspace allocated at construction, and a cache of matmul plans
// (descriptor, layouts and heuristic algorithm) keyed by shape, transposes, dtypes and pointer
// alignment, so a training step queries the heuristic once per distinct GEMM. The workspace
// is shared by every GEMM launched through this context: use one context per stream.
class GemmContext {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  explicit GemmContext(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  // Column-major D[m, n] = alpha * op(A) op(B) + beta * C, in cuBLAS's own convention:
  // op(A) is [m, k] (A stored [m, k] with lda >= m, or [k, m] when trans_a), op(B) is [k, n];
  // D has leading dimension ldd >= m. C is D (in place) unless c is given: then C is c, of D's
  // type and leading dimension (a residual added in the epilogue, where the product is still
  // fp32, so the sum is rounded once). Compute is fp32 (CUBLAS_COMPUTE_32F),
  // or, with tf32 and fp32 operands, CUBLAS_COMPUTE_32F_FAST_TF32: the operands rounded to
  // TF32 (10 mantissa bits) on the tensor cores, accumulated in fp32. k = 0 (a product of
  // nothing, which cuBLASLt refuses) takes beta 0 or 1: D is zeros, or C.
  // The row-major launchers below are written in terms of this.
  void matmul(void* d, cudaDataType_t d_type, int64_t ldd, const void* a, cudaDataType_t a_type,
              int64_t lda, bool trans_a, const void* b, cudaDataType_t b_type, int64_t ldb,
              bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, float beta,
              cudaStream_t stream, bool tf32 = false, const void* c = nullptr);

  // The same for FP8 operands (cuBLASLt takes them only as TN: trans_a set, trans_b not): the
  // product is scaled by *a_scale and *b_scale (device pointers, read when the GEMM runs, so
  // scales computed on the GPU need no host round trip). fast_accum: Hopper's faster FP8
  // accumulation, for the forward; off for gradients.
  void matmul_fp8(void* d, cudaDataType_t d_type, int64_t ldd, const void* a, cudaDataType_t a_type,
                  int64_t lda, const void* b, cudaDataType_t b_type, int64_t ldb, int64_t m,
                  int64_t n, int64_t k, const float* a_scale, const float* b_scale, float beta,
                  bool fast_accum, cudaStream_t stream);

  size_t workspace_bytes() const { return workspace_bytes_; }
  size_t cached_plans() const { return plans_.size(); }

 private:
  // (trans_a, trans_b, m, n, k, lda, ldb, ldd, a_type, b_type, d_type, alignment a, b, d,
  // fast accumulation: Hopper's for FP8 operands, TF32 for fp32 ones)
  using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                             int, int, int, int, int, bool>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  const Plan& plan_for(const PlanKey& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<PlanKey, Plan> plans_;
};

// The three products of a linear layer, all row-major, W [n, k] in Hugging Face's layout.
// y[m, n] (bf16, overwritten) = x[m, k] . w[n, k]^T (+ residual[m, n] when not null: the
// residual stream's add, fused; residual may be y).
void linear_forward(GemmContext& ctx, __nv_bfloat16* y, const __nv_bfloat16* x,
                    const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                    const __nv_bfloat16* residual = nullptr);
// dx[m, k] (bf16) = dy[m, n] . w[n, k], overwritten, or with accumulate added to what dx holds
// (the input gradients of projections that share an input, summed before one rounding).
void linear_backward_input(GemmContext& ctx, __nv_bfloat16* dx, const __nv_bfloat16* dy,
                           const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k,
                           cudaStream_t stream, bool accumulate = false);
// dw[n, k] (fp32) += dy[m, n]^T . x[m, k], so micro-batches add up; without accumulate, dw =
// the product (what dw held is not read).
void linear_backward_weight(GemmContext& ctx, float* dw, const __nv_bfloat16* dy,
                            const __nv_bfloat16* x, int64_t m, int64_t n, int64_t k,
                            cudaStream_t stream, bool accumulate = true);
// The same into a bf16 dw (one rounding of the fp32 product plus what dw holds): the gradient
// shards of a bf16 run, which take each micro-batch's sum directly.
void linear_backward_weight(GemmContext& ctx, __nv_bfloat16* dw, const __nv_bfloat16* dy,
                            const __nv_bfloat16* x, int64_t m, int64_t n, int64_t k,
                            cudaStream_t stream, bool accumulate = true);

// out[m, n] = a_scale * b_scale * a[m, k] . b[n, k]^T, FP8 operands row-major with k contiguous
// (a of dtype a_type, b of b_type: E4M3 x E4M3, or one of them E5M2), out bf16 (overwritten) or
// fp32 (accumulate: += when set). The forward is (x, W), dgrad (dy, W^T), wgrad (dy^T, x^T).
// m, n, k multiples of 16.
void fp8_gemm_tn(GemmContext& ctx, void* out, cudaDataType_t out_type, const uint8_t* a,
                 cudaDataType_t a_type, const float* a_scale, const uint8_t* b,
                 cudaDataType_t b_type, const float* b_scale, int64_t m, int64_t n, int64_t k,
                 bool accumulate, bool fast_accum, cudaStream_t stream);

// c[m, n] = alpha * op(a) . op(b) + beta * c, everything fp32 and row-major, op(a) [m, k] (a
// stored [k, m] when trans_a), op(b) [k, n] (b stored [n, k] when trans_b): the twin of
// frugal::cpu::matmul, for GaLore's projections. fp32 compute (CUBLAS_COMPUTE_32F), or with
// tf32 the tensor cores' TF32 (CUBLAS_COMPUTE_32F_FAST_TF32: about 8x the fp32 rate on an
// H100/H200, each operand rounded to 10 mantissa bits, sums in fp32).
// k must be at least 1 (ops/ handles the empty product).
void matmul_f32(GemmContext& ctx, float* c, const float* a, bool trans_a, const float* b,
                bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                cudaStream_t stream, bool tf32 = false);

// The same product of bf16 operands into fp32 c (CUBLAS_COMPUTE_32F: each product exact, the
// sums in fp32): GaLore's bf16 projections, about twice TF32's rate.
void matmul_bf16_f32(GemmContext& ctx, float* c, const __nv_bfloat16* a, bool trans_a,
                     const __nv_bfloat16* b, bool trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, float beta, cudaStream_t stream);

}  // namespace frugal::cuda
