// Ring attention on GPUs over NCCL (1 or 2 ranks, one GPU each) against the CPU kernel on the
// whole sequence: every rank computes the fp32 reference from the same bf16-rounded inputs,
// then the ring on its zigzag slice in bf16, and compares out, lse, dq, dk, dv of its own
// tokens to bf16 tolerance. Sequence lengths that need padding, GQA 4:1, head dims 64 (the
// tensor-core kernels) and 32 (the simple ones). Run under mpiexec -n 1 and -n 2; it skips
// itself when there are fewer GPUs than ranks.
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "catch_compat.h"
#include "core/device.h"
#include "gpu_support.h"
#include "ops/ops.h"
#include "parallel/mesh.h"
#include "parallel/nccl_comm.h"
#include "parallel/ring_attention.h"
#include "ring_support.h"

using namespace frugal;
using test::relative_error;

namespace {

// Uniform in [-amplitude, amplitude), rounded to bf16 (the inputs both sides see).
Tensor random_tensor(const Shape& shape, uint32_t seed, float amplitude) {
  Tensor t = test::random_tensor(shape, seed, amplitude);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = bf16_to_float(float_to_bf16(t.data<float>()[i]));
  return t;
}

Tensor to_gpu_bf16(const Tensor& host, DeviceContext& gpu) {
  return ops::convert(ops::convert(host, DType::f32, gpu.device_memory()), DType::bf16,
                      gpu.device_memory());
}

void check_ring(Comm& cp, DeviceContext& gpu, int64_t seq, int64_t heads, int64_t kv_heads,
                int64_t head_dim, uint32_t seed, int64_t window = 0) {
  const int64_t batch = 2;
  // bf16 outputs and gradients: one rounding (2^-9 relative) of values whose sums carry a
  // few more; 2^-6 of the largest value bounds both with room for the fp32 summation order.
  const double tolerance = 1.0 / 64;
  INFO("cp " << cp.size() << " rank " << cp.rank() << " seq " << seq << " heads " << heads << "/"
             << kv_heads << " head dim " << head_dim << " window " << window);
  const Tensor q = random_tensor({batch * seq, heads, head_dim}, seed, 2.0f);
  const Tensor k = random_tensor({batch * seq, kv_heads, head_dim}, seed + 1, 2.0f);
  const Tensor v = random_tensor({batch * seq, kv_heads, head_dim}, seed + 2, 1.0f);
  const Tensor dout = random_tensor({batch * seq, heads, head_dim}, seed + 3, 1.0f);
  const ops::Attention ref = ops::attention(q, k, v, batch, window);  // CPU, fp32
  const ops::AttentionGrads ref_grads = ops::attention_backward(dout, q, k, v, ref, batch, window);

  const ZigzagLayout layout = zigzag_layout(seq, cp.size(), cp.rank());
  auto local = [&](const Tensor& t) { return to_gpu_bf16(zigzag_scatter(t, layout, batch), gpu); };
  const Tensor ql = local(q), kl = local(k), vl = local(v), doutl = local(dout);
  const ops::Attention fwd = ring_attention_forward(ql, kl, vl, batch, cp, window);
  const ops::AttentionGrads grads =
      ring_attention_backward(doutl, ql, kl, vl, fwd, batch, cp, window);
  CHECK(fwd.out.dtype() == DType::bf16);
  CHECK(grads.dq.dtype() == DType::bf16);

  auto host = [](const Tensor& t) { return ops::to_host_f32(t); };
  CHECK(relative_error(host(fwd.out), zigzag_scatter(ref.out, layout, batch), layout, batch) <
        tolerance);
  CHECK(relative_error(host(grads.dq), zigzag_scatter(ref_grads.dq, layout, batch), layout, batch) <
        tolerance);
  CHECK(relative_error(host(grads.dk), zigzag_scatter(ref_grads.dk, layout, batch), layout, batch) <
        tolerance);
  CHECK(relative_error(host(grads.dv), zigzag_scatter(ref_grads.dv, layout, batch), layout, batch) <
        tolerance);
  CHECK(test::lse_error(host(fwd.lse), ref.lse, layout, batch * heads) < 1e-4);  // fp32 all the way
}

}  // namespace

TEST_CASE("ring attention on GPUs matches the CPU kernel on the whole sequence", "[gpu][ring]") {
  const auto world = test::make_gpu_world();
  if (!world) return;
  check_ring(*world->nccl, *world->gpu, 301, 8, 2, 64, 11);
  check_ring(*world->nccl, *world->gpu, 130, 4, 1, 32, 21);
  check_ring(*world->nccl, *world->gpu, 512, 4, 4, 128, 31);
  // Sliding windows: shorter than a chunk, and about one rank's rows (2 ranks: 4 chunks).
  check_ring(*world->nccl, *world->gpu, 301, 8, 2, 64, 41, 50);
  check_ring(*world->nccl, *world->gpu, 512, 4, 4, 128, 43, 256);
  check_ring(*world->nccl, *world->gpu, 130, 4, 1, 32, 47, 33);
}
