// cuBLASLt GEMMs for linear layers: a context with a cached plan per GEMM shape and one
// workspace, and the row-major launchers for y = x W^T, dx = dy W and dW += dy^T x.
//
// Row-major through a column-major library: a row-major matrix X [r, c] with row stride c is,
// byte for byte, the column-major matrix X^T [c, r] with leading dimension c. So each row-major
// product C = A B is computed as the column-major product C^T = B^T A^T, i.e. the operands swap
// places and no data moves. For the three products of a linear layer (W [n, k] row-major):
//
//   forward   y [m, n] = x [m, k] W^T       ->  y^T [n, m] = op_T(W^T [k, n]) . x^T [k, m]
//             cuBLAS (m', n', k') = (n, m, k); A = w (stored [k, n], ld k, transposed);
//             B = x (stored [k, m], ld k); D = y (ld n).
//   backward  dx [m, k] = dy [m, n] W       ->  dx^T [k, m] = W^T [k, n] . dy^T [n, m]
//             (m', n', k') = (k, m, n); A = w (stored [k, n], ld k); B = dy (stored [n, m],
//             ld n); D = dx (ld k). No transposes.
//   weight    dW [n, k] += dy^T [n, m] x    ->  dW^T [k, n] += x^T [k, m] . op_T(dy^T [n, m])
//             (m', n', k') = (k, n, m); A = x (stored [k, m], ld k); B = dy (stored [n, m],
//             ld n, transposed); D = dw (fp32 or bf16, ld k), beta = 1 (0: overwritten).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"

namespace frugal::cuda {

namespace {

// The largest power of two (at most 256, cuBLASLt's default requirement) dividing the address:
// cuBLASLt's heuristic must know it, because row blocks of a tensor are not 256-byte aligned.
int pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int alignment = 1;
  while (alignment < 256 && (address & static_cast<uintptr_t>(alignment)) == 0) alignment *= 2;
  return alignment;
}

}  // namespace

GemmContext::GemmContext(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (workspace_bytes_ > 0) CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

GemmContext::~GemmContext() {
  // Destructors must not throw: errors while freeing are ignored.
  for (auto& [key, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.d);
    cublasLtMatmulDescDestroy(plan.desc);
  }
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

const GemmContext::Plan& GemmContext::plan_for(const PlanKey& key) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second;

  const auto [trans_a, trans_b, m, n, k, lda, ldb, ldd, a_type, b_type, d_type, align_a, align_b,
              align_d, fast_accum] = key;
  Plan plan;
  const bool tf32 = fast_accum && a_type == CUDA_R_32F && b_type == CUDA_R_32F;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(
      &plan.desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (a_type == CUDA_R_8F_E4M3 || a_type == CUDA_R_8F_E5M2) {
    const int8_t fast = fast_accum ? 1 : 0;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                sizeof(fast)));
  }
  // Stored shapes (column-major rows x cols): A is [m, k] or, transposed, [k, m]; likewise B.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, static_cast<cudaDataType_t>(a_type),
                                          trans_a ? k : m, trans_a ? m : k, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, static_cast<cudaDataType_t>(b_type),
                                          trans_b ? n : k, trans_b ? k : n, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, static_cast<cudaDataType_t>(d_type), m, n, ldd));

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_workspace = workspace_bytes_;
  const uint32_t alignments[3] = {static_cast<uint32_t>(align_a), static_cast<uint32_t>(align_b),
                                  static_cast<uint32_t>(align_d)};
  cublasLtMatmulHeuristicResult_t result{};
  int n_results = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &alignments[0], sizeof(uint32_t));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &alignments[1], sizeof(uint32_t));
  // C has D's layout (it is D, or a residual in the same layout): key's alignment covers both.
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &alignments[2], sizeof(uint32_t));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &alignments[2], sizeof(uint32_t));
  // An output narrower than fp32 (bf16, the FP8 GEMMs' bf16) is rounded once: split-K partial
  // sums may meet only in the compute type (an fp32 workspace), never in the output's type or
  // by atomic adds into it (each partial rounded, and in place added in whatever order they
  // come). The GPU test of a bf16 weight gradient GEMM (1000-row reduction) found 2840 of 12480
  // elements off by more than half an ulp without this (H200, 2026-12-03).
  if (status == CUBLAS_STATUS_SUCCESS && d_type != CUDA_R_32F) {
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &schemes, sizeof(schemes));
  }
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.d, plan.d,
                                            pref, 1, &result, &n_results);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || n_results == 0) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.d);
    cublasLtMatmulDescDestroy(plan.desc);
    check_cublas(status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    fail("cuBLASLt has no algorithm for the GEMM m ", m, " n ", n, " k ", k, " trans_a ", trans_a,
         " trans_b ", trans_b, " lda ", lda, " ldb ", ldb, " ldd ", ldd, " dtypes ", a_type, "/",
         b_type, "/", d_type, " alignments ", align_a, "/", align_b, "/", align_d);
  }
  plan.algo = result.algo;
  return plans_.emplace(key, plan).first->second;
}

void GemmContext::matmul(void* d, cudaDataType_t d_type, int64_t ldd, const void* a,
                         cudaDataType_t a_type, int64_t lda, bool trans_a, const void* b,
                         cudaDataType_t b_type, int64_t ldb, bool trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, float beta, cudaStream_t stream, bool tf32,
                         const void* c) {
  FRUGAL_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm m ", m, " n ", n, " k ", k);
  if (m == 0 || n == 0) return;
  if (c == nullptr) c = d;
  if (k == 0) {
    // cuBLASLt rejects k = 0; D = beta * C is then all there is to do: C itself, or zeros.
    FRUGAL_CHECK(beta == 1.0f || beta == 0.0f, "gemm with k = 0 supports beta 0 or 1, got ", beta);
    if (c == d && beta == 1.0f) return;
    const size_t element = d_type == CUDA_R_32F ? 4 : d_type == CUDA_R_16BF ? 2 : 0;
    FRUGAL_CHECK(element > 0, "gemm with k = 0 into dtype ", int(d_type));
    const size_t pitch = size_t(ldd) * element, width = size_t(m) * element;
    if (beta == 0.0f)
      CUDA_CHECK(cudaMemset2DAsync(d, pitch, 0, width, size_t(n), stream));
    else
      CUDA_CHECK(cudaMemcpy2DAsync(d, pitch, c, pitch, width, size_t(n), cudaMemcpyDeviceToDevice,
                                   stream));
    return;
  }
  const PlanKey key{trans_a, trans_b, m, n, k, lda, ldb, ldd, static_cast<int>(a_type),
                    static_cast<int>(b_type), static_cast<int>(d_type), pointer_alignment(a),
                    pointer_alignment(b),
                    // C shares D's layout: the plan asks for the alignment of both.
                    std::min(pointer_alignment(d), pointer_alignment(c)),
                    tf32 && a_type == CUDA_R_32F && b_type == CUDA_R_32F};
  const Plan& plan = plan_for(key);
  CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, c, plan.d, d,
                              plan.d, &plan.algo, workspace_, workspace_bytes_, stream));
}

void GemmContext::matmul_fp8(void* d, cudaDataType_t d_type, int64_t ldd, const void* a,
                             cudaDataType_t a_type, int64_t lda, const void* b,
                             cudaDataType_t b_type, int64_t ldb, int64_t m, int64_t n, int64_t k,
                             const float* a_scale, const float* b_scale, float beta,
                             bool fast_accum, cudaStream_t stream) {
  FRUGAL_CHECK(m % 16 == 0 && n % 16 == 0 && k % 16 == 0, "fp8 gemm m ", m, " n ", n, " k ", k,
               ": cuBLASLt's FP8 GEMMs need multiples of 16");
  if (m == 0 || n == 0 || k == 0) return;
  // cuBLASLt refuses scale pointers at a 4-byte offset (NOT_SUPPORTED, on the H200).
  FRUGAL_CHECK(pointer_alignment(a_scale) >= 16 && pointer_alignment(b_scale) >= 16,
               "fp8 gemm: scale pointers ", a_scale, " and ", b_scale, " must be 16-byte aligned");
  const PlanKey key{true,
                    false,
                    m,
                    n,
                    k,
                    lda,
                    ldb,
                    ldd,
                    static_cast<int>(a_type),
                    static_cast<int>(b_type),
                    static_cast<int>(d_type),
                    pointer_alignment(a),
                    pointer_alignment(b),
                    pointer_alignment(d),
                    fast_accum};
  const Plan& plan = plan_for(key);
  // The scale pointers change from call to call (each tensor has its own): set on the cached
  // descriptor before the launch, which reads them.
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                              &a_scale, sizeof(a_scale)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                              &b_scale, sizeof(b_scale)));
  const float alpha = 1.0f;
  const cublasStatus_t status =
      cublasLtMatmul(handle_, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d, plan.d,
                     &plan.algo, workspace_, workspace_bytes_, stream);
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt FP8 GEMM failed (", cublasLtGetStatusName(status), ") for m ", m, " n ", n,
         " k ", k, " lda ", lda, " ldb ", ldb, " ldd ", ldd, " dtypes ", int(a_type), "/",
         int(b_type), "/", int(d_type), " alignments ", pointer_alignment(a), "/",
         pointer_alignment(b), "/", pointer_alignment(d), " scales ", a_scale, "/", b_scale,
         " beta ", beta, " fast ", fast_accum);
}

// Row-major out[m, n] = a[m, k] b[n, k]^T is column-major out^T [n, m] = op_T(b) a: b is
// cuBLAS's A (stored [k, n] column-major, ld k, transposed), a its B (stored [k, m], ld k).
void fp8_gemm_tn(GemmContext& ctx, void* out, cudaDataType_t out_type, const uint8_t* a,
                 cudaDataType_t a_type, const float* a_scale, const uint8_t* b,
                 cudaDataType_t b_type, const float* b_scale, int64_t m, int64_t n, int64_t k,
                 bool accumulate, bool fast_accum, cudaStream_t stream) {
  FRUGAL_CHECK(!accumulate || out_type == CUDA_R_32F, "fp8 gemm accumulates only into fp32");
  ctx.matmul_fp8(out, out_type, n, b, b_type, k, a, a_type, k, n, m, k, b_scale, a_scale,
                 accumulate ? 1.0f : 0.0f, fast_accum, stream);
}

void linear_forward(GemmContext& ctx, __nv_bfloat16* y, const __nv_bfloat16* x,
                    const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                    const __nv_bfloat16* residual) {
  ctx.matmul(y, CUDA_R_16BF, n, w, CUDA_R_16BF, k, /*trans_a=*/true, x, CUDA_R_16BF, k,
             /*trans_b=*/false, n, m, k, 1.0f, residual != nullptr ? 1.0f : 0.0f, stream,
             /*tf32=*/false, residual);
}

void linear_backward_input(GemmContext& ctx, __nv_bfloat16* dx, const __nv_bfloat16* dy,
                           const __nv_bfloat16* w, int64_t m, int64_t n, int64_t k,
                           cudaStream_t stream, bool accumulate) {
  ctx.matmul(dx, CUDA_R_16BF, k, w, CUDA_R_16BF, k, /*trans_a=*/false, dy, CUDA_R_16BF, n,
             /*trans_b=*/false, k, m, n, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}

void linear_backward_weight(GemmContext& ctx, float* dw, const __nv_bfloat16* dy,
                            const __nv_bfloat16* x, int64_t m, int64_t n, int64_t k,
                            cudaStream_t stream, bool accumulate) {
  ctx.matmul(dw, CUDA_R_32F, k, x, CUDA_R_16BF, k, /*trans_a=*/false, dy, CUDA_R_16BF, n,
             /*trans_b=*/true, k, n, m, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}

void linear_backward_weight(GemmContext& ctx, __nv_bfloat16* dw, const __nv_bfloat16* dy,
                            const __nv_bfloat16* x, int64_t m, int64_t n, int64_t k,
                            cudaStream_t stream, bool accumulate) {
  ctx.matmul(dw, CUDA_R_16BF, k, x, CUDA_R_16BF, k, /*trans_a=*/false, dy, CUDA_R_16BF, n,
             /*trans_b=*/true, k, n, m, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}

// Row-major c = op(a) op(b) is column-major c^T = op(b)^T op(a)^T: b is cuBLAS's A, a its B.
// b stored [k, n] row-major is column-major [n, k] (ld n): op(b)^T as it is; stored [n, k]
// (trans_b) it is column-major [k, n] (ld k), transposed. Likewise a, with ld k or m.
void matmul_f32(GemmContext& ctx, float* c, const float* a, bool trans_a, const float* b,
                bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                cudaStream_t stream, bool tf32) {
  FRUGAL_CHECK(k >= 1, "matmul_f32 with k ", k);
  ctx.matmul(c, CUDA_R_32F, n, b, CUDA_R_32F, trans_b ? k : n, trans_b, a, CUDA_R_32F,
             trans_a ? m : k, trans_a, n, m, k, alpha, beta, stream, tf32);
}

void matmul_bf16_f32(GemmContext& ctx, float* c, const __nv_bfloat16* a, bool trans_a,
                     const __nv_bfloat16* b, bool trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, float beta, cudaStream_t stream) {
  FRUGAL_CHECK(k >= 1, "matmul_bf16_f32 with k ", k);
  // Row-major c = op(a) op(b) is column-major c^T = op(b)^T op(a)^T, as in matmul_f32.
  ctx.matmul(c, CUDA_R_32F, n, b, CUDA_R_16BF, trans_b ? k : n, trans_b, a, CUDA_R_16BF,
             trans_a ? m : k, trans_a, n, m, k, alpha, beta, stream);
}

}  // namespace frugal::cuda
