// Box-Muller in double on the GPU, each pair from its own position of its row's stream
// (kernels/normal_init.h), with the values the device libm could round differently from the
// host's handed over by index.
//
// Why a hand-over and not the GPU's numbers: the random bases of benchmarks must be the models
// the CPU makes from the same seed (a run may move between devices and rank counts). log, cos
// and sin are not correctly rounded on either side (CUDA: 1 and 2 ulps; glibc: under 1 ulp), so
// the double results may differ in their last bits; the fp32 value the weight keeps then differs
// only if the double lies within those few ulps of an fp32 rounding boundary. The kernel tests a
// much wider interval, a relative 2^-40 (2^13 double ulps) around its result: if both ends round
// to one fp32 value, so does the host's result; otherwise the host redoes the element. The
// arithmetic around the three functions is the host's (__dmul_rn: no contraction, the same
// operation order), so only their errors count.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/normal_init.h"
#include "kernels/cuda/pack16.cuh"
#include "kernels/normal_init.h"

namespace frugal::cuda {

namespace {

constexpr int kThreads = 256;
constexpr double kMargin = 0x1.0p-40;  // relative; the libms differ by ~2^-50 here

// value(d) rounded to fp32, or a flag that the host must redo it.
__device__ __forceinline__ float to_float_checked(double d, bool* uncertain) {
  const float lo = __double2float_rn(__dmul_rn(d, 1.0 - kMargin));
  const float hi = __double2float_rn(__dmul_rn(d, 1.0 + kMargin));
  *uncertain = lo != hi;
  return __double2float_rn(d);
}

__device__ __forceinline__ void hand_over(int64_t index, int64_t* uncertain,
                                          unsigned long long* count, int64_t capacity) {
  const unsigned long long slot = atomicAdd(count, 1ull);
  if (static_cast<int64_t>(slot) < capacity) uncertain[slot] = index;
}

__global__ void normal_rows_kernel(float* out, int64_t rows, int64_t row_len, int64_t pairs_per_row,
                                   uint64_t key, int64_t first_row, double std, int64_t* uncertain,
                                   unsigned long long* count, int64_t capacity) {
  const int64_t total = rows * pairs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < total;
       q += stride) {
    const int64_t r = q / pairs_per_row, pair = q % pairs_per_row;
    double u1, u2;
    normal_pair_uniforms(key, first_row + r, pair, &u1, &u2);
    // The host's expression: std * radius * cos(2 pi u2), left to right.
    const double radius = __dsqrt_rn(__dmul_rn(-2.0, log(u1)));
    const double angle = __dmul_rn(2.0 * M_PI, u2);
    double s, c;
    sincos(angle, &s, &c);
    const double scaled = __dmul_rn(std, radius);
    const int64_t j = 2 * pair;
    float* row = out + r * row_len;
    bool redo;
    row[j] = to_float_checked(__dmul_rn(scaled, c), &redo);
    if (redo) hand_over(r * row_len + j, uncertain, count, capacity);
    if (j + 1 < row_len) {
      row[j + 1] = to_float_checked(__dmul_rn(scaled, s), &redo);
      if (redo) hand_over(r * row_len + j + 1, uncertain, count, capacity);
    }
  }
}

__global__ void scatter_kernel(float* out, const int64_t* index, const float* values, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[index[i]] = values[i];
}

}  // namespace

void normal_rows(float* out, int64_t rows, int64_t row_len, uint64_t key, int64_t first_row,
                 float std, int64_t* uncertain, unsigned long long* uncertain_count,
                 int64_t capacity, cudaStream_t stream) {
  const int64_t pairs_per_row = (row_len + 1) / 2;
  if (rows <= 0 || pairs_per_row <= 0) return;
  const unsigned blocks = grid_stride_blocks(rows * pairs_per_row, kThreads);
  normal_rows_kernel<<<blocks, kThreads, 0, stream>>>(out, rows, row_len, pairs_per_row, key,
                                                      first_row, static_cast<double>(std),
                                                      uncertain, uncertain_count, capacity);
  CUDA_CHECK_LAUNCH();
}

void scatter_values(float* out, const int64_t* index, const float* values, int64_t n,
                    cudaStream_t stream) {
  if (n <= 0) return;
  scatter_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(out, index, values, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace frugal::cuda
