// GaLore's projector on row shards: the exact top-r singular vectors from the summed Gram
// matrix, or a randomized range finder whose products are summed over the shards. Big products
// run through ops (on the gradient's device); the small factorisations run on the host in
// float64, as host stages of a coroutine (ProjectorRefresh) that a driver completes at once or
// on a worker thread (galore.refresh = pipelined). The host stages call the CPU kernels on
// buffers allocated beforehand on the calling thread: no ops, no device, no shared arena.
#include "optim/galore_projector.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "kernels/cpu/dense.h"
#include "ops/ops.h"

namespace frugal {

GaloreSide galore_side(const Shape& full_shape) {
  FRUGAL_CHECK(full_shape.size() == 2, "GaLore projects matrices, not ", shape_string(full_shape));
  return full_shape[0] >= full_shape[1] ? GaloreSide::right : GaloreSide::left;
}

Tensor galore_scratch(const Tensor& like, const Shape& shape, Arena& scratch, DType dtype) {
  if (like.device() == Device::cpu) return Tensor::empty(shape, dtype, scratch);
  return ops::empty_like(like, shape, dtype);
}

Tensor host_f64(const Tensor& t) {
  const Tensor host = ops::to_host_f32(t);  // t itself when it is a host tensor: only read
  Tensor out = Tensor::empty(t.shape(), DType::f64);
  const float* in = host.data<float>();
  double* o = out.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) o[i] = in[i];
  return out;
}

Tensor f32_beside(const Tensor& host_f64_tensor, const Tensor& like, Arena& scratch) {
  Tensor f32 = Tensor::empty(host_f64_tensor.shape(), DType::f32,
                             like.device() == Device::cpu ? scratch : host_arena());
  const double* in = host_f64_tensor.data<double>();
  float* o = f32.data<float>();
  for (int64_t i = 0; i < f32.numel(); ++i) o[i] = static_cast<float>(in[i]);
  return ops::on_device_of(f32, like);
}

namespace {

// Sums a tensor over the ranks, or leaves it (a matrix every rank holds whole).
using SumInPlace = std::function<void(Tensor&)>;
const SumInPlace kReplicated = [](Tensor&) {};

// Suspends a refresh on a host stage: its driver completes the work, then resumes it.
struct HostStage {
  RefreshHostWork work;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<ProjectorRefresh::promise_type> h) {
    h.promise().host_work = std::move(work);
  }
  void await_resume() const noexcept {}
};

// A small f32 matrix's host copy, started beside the compute stream, and its float64 twin
// that the host work fills (both allocated here, on the calling thread).
struct Download {
  Tensor host32, host64;
  ops::SideCopy copy;
  Download(const Tensor& device_tensor, Arena& scratch)
      : host32(Tensor::empty(device_tensor.shape(), DType::f32, scratch)),
        host64(Tensor::empty(device_tensor.shape(), DType::f64, scratch)),
        copy(host32, device_tensor) {}
  void widen() {  // host work: host64 = host32
    const float* in = host32.data<float>();
    double* out = host64.data<double>();
    for (int64_t i = 0; i < host32.numel(); ++i) out[i] = in[i];
  }
};

// Flips each row of the host f64 [k, n] so that its largest component (the first of equal
// ones) is positive: singular vectors are defined up to sign, and a fixed sign keeps the
// subspace's coordinates, and so moments kept across a refresh, comparable between runs and
// rank counts.
void fix_signs(Tensor& rows) {
  const int64_t k = rows.size(0), n = rows.size(1);
  double* v = rows.data<double>();
  for (int64_t i = 0; i < k; ++i) {
    double* row = v + i * n;
    int64_t largest = 0;
    for (int64_t j = 1; j < n; ++j)
      if (std::abs(row[j]) > std::abs(row[largest])) largest = j;
    if (row[largest] < 0)
      for (int64_t j = 0; j < n; ++j) row[j] = -row[j];
  }
}

// The eigenvectors of the k largest eigenvalues of a symmetric host f64 gram [n, n], as rows
// [k, n] (largest first, signs fixed), and the square roots of those eigenvalues (the singular
// values of the matrix whose Gram it is; negative rounding clamped to zero). Allocated on the
// calling thread; compute() is host work.
struct TopSingular {
  Tensor vectors;  // host f64 [k, n]
  std::vector<double> values;
  Tensor eigenvalues;  // host f64 [n], work
  TopSingular(int64_t n, int64_t k, Arena& scratch)
      : vectors(Tensor::empty({k, n}, DType::f64, scratch)),
        values(size_t(k)),
        eigenvalues(Tensor::empty({n}, DType::f64, scratch)) {}
  void compute(Tensor& gram) {  // gram overwritten
    const int64_t n = gram.size(0), k = vectors.size(0);
    cpu::symmetric_eigen(gram.data<double>(), eigenvalues.data<double>(), n);  // ascending
    for (int64_t i = 0; i < k; ++i) {
      const int64_t from = n - 1 - i;
      std::copy_n(gram.data<double>() + from * n, n, vectors.data<double>() + i * n);
      values[size_t(i)] = std::sqrt(std::max(0.0, eigenvalues.data<double>()[from]));
    }
    fix_signs(vectors);
  }
};

// One pass of CholeskyQR (Fukaya et al. 2014) over y [rows, l], this rank's rows of a tall
// matrix whose columns become orthonormal (sum_in_place sums its Gram over the ranks), or, with
// `rows`, a wide y [l, n] every rank holds whole whose rows do: y <- y R^-1 (rows: R^-T y) with
// R^T R = the Gram. Two passes make CholeskyQR2, since one leaves an error of the order of the
// condition number squared times the rounding. A Gram that is not positive definite in floating
// point (a sketch of a gradient of lower rank than the sketch) is shifted by a small multiple of
// its trace first, and one more pass then cleans up what the shift left (shifted CholeskyQR3).
struct CholeskyPass {
  Download gram;
  Tensor r;  // host f64 [l, l]: R, then R^-1
  bool shifted = false;
  CholeskyPass(const Tensor& device_gram, Arena& scratch)
      : gram(device_gram, scratch), r(Tensor::empty(device_gram.shape(), DType::f64, scratch)) {}
  void factor() {  // host work
    gram.widen();
    const int64_t l = r.size(0);
    const double* g = gram.host64.data<double>();
    double* rr = r.data<double>();
    double trace = 0;
    for (int64_t i = 0; i < l; ++i) trace += g[i * l + i];
    std::copy_n(g, l * l, rr);
    for (double shift = 1e-6 * trace / double(l); !cpu::cholesky_upper(rr, l); shift *= 10) {
      FRUGAL_CHECK(trace > 0 && std::isfinite(trace) && shift < trace, "CholeskyQR of ", l,
                   " sketch vectors: their Gram is zero or not finite (trace ", trace, ")");
      std::copy_n(g, l * l, rr);
      for (int64_t i = 0; i < l; ++i) rr[i * l + i] += shift;
      shifted = true;
    }
    cpu::invert_upper(rr, l);
  }
};

// The device half before a pass: the Gram of y, summed, and its host copy started.
std::unique_ptr<CholeskyPass> start_pass(const Tensor& y, bool rows, const SumInPlace& sum,
                                         Arena& scratch) {
  const int64_t l = rows ? y.size(0) : y.size(1);
  Tensor gram = galore_scratch(y, {l, l}, scratch);
  ops::matmul(gram, y, !rows, y, rows);
  sum(gram);
  return std::make_unique<CholeskyPass>(gram, scratch);
}
HostStage host_stage(std::vector<ops::SideCopy> copies, std::function<void()> math) {
  HostStage stage;
  stage.work.copies = std::move(copies);
  stage.work.math = std::move(math);
  return stage;
}
HostStage factor_stage(CholeskyPass& pass) {
  std::vector<ops::SideCopy> copies;
  copies.push_back(std::move(pass.gram.copy));
  return host_stage(std::move(copies), [&pass] { pass.factor(); });
}
// The device half after a pass: y <- y R^-1, or R^-T y.
void finish_pass(Tensor& y, bool rows, const CholeskyPass& pass, Arena& scratch) {
  const Tensor r_inverse = f32_beside(pass.r, y, scratch);
  Tensor product = galore_scratch(y, y.shape(), scratch);
  if (rows)
    ops::matmul(product, r_inverse, true, y, false);
  else
    ops::matmul(product, y, false, r_inverse, false);
  ops::copy(y, product);
}

// CholeskyQR2 (or 3, shifted) of y, one host stage a pass: written out at each use below, since
// a stage must suspend the refresh itself. (A macro would hide the co_await.)

// Exact: the Gram G^T G [n, n] summed over the row shards, whose top eigenvectors are G's top
// right singular vectors V. Right side: Q = V^T. Left side: the left singular vectors of this
// rank's rows, P = G V Sigma^-1 (row-local). A singular value of zero (a gradient of rank
// below r) gives a zero column of P, where the reference's SVD would pick an arbitrary
// orthonormal completion: both project nothing of the gradient there.
ProjectorRefresh exact_projector(Tensor projector, Tensor g, Shape full, int64_t rank,
                                 StepCollectives collectives, Arena& scratch) {
  const int64_t n = full[1];
  Tensor gram = galore_scratch(g, {n, n}, scratch);
  ops::matmul(gram, g, true, g, false);
  collectives.sum_in_place(gram);
  Download gram_host(gram, scratch);
  TopSingular top(n, rank, scratch);
  {
    std::vector<ops::SideCopy> copies;
    copies.push_back(std::move(gram_host.copy));
    co_await host_stage(std::move(copies), [&] {
      gram_host.widen();
      top.compute(gram_host.host64);
    });
  }
  if (galore_side(full) == GaloreSide::right) {
    ops::copy(projector, f32_beside(top.vectors, projector, scratch));
    co_return;
  }
  Tensor v_over_sigma = Tensor::empty({n, rank}, DType::f64);  // V Sigma^-1
  for (int64_t j = 0; j < rank; ++j) {
    const double inverse = top.values[size_t(j)] > 0 ? 1.0 / top.values[size_t(j)] : 0.0;
    for (int64_t i = 0; i < n; ++i)
      v_over_sigma.data<double>()[i * rank + j] = top.vectors.data<double>()[j * n + i] * inverse;
  }
  ops::matmul(projector, g, false, f32_beside(v_over_sigma, g, scratch), false);
}

// Randomized: Y = G Omega (row-local), orthonormalized; q power iterations Y <- G (G^T Y) that
// sharpen the decay of the spectrum; then B = Y^T G [l, n] (summed), whose small SVD, from the
// eigen-decomposition of B B^T [l, l], gives the subspace: with B B^T = W S^2 W^T, G's left
// singular vectors are about Y W (row-local: the left projector), its right ones the rows of
// S^-1 W^T B (the right projector, orthonormalized once more against rounding).
ProjectorRefresh randomized_projector(Tensor projector, Tensor g, Shape full,
                                      GaloreProjectorSettings s, uint64_t seed,
                                      StepCollectives collectives, Arena& scratch) {
  const int64_t rows = g.size(0), n = full[1], rank = s.rank;
  const int64_t l = std::min(rank + s.oversampling, std::min(full[0], full[1]));
  // Under hybrid sharding with G one replica's sum, every product with G is summed over the
  // replicas too (replica_sum_in_place; the identity otherwise): they are linear in G, and
  // what they multiply it by (Omega, Y, Z) is the same on every replica.
  const auto over_replicas = [&](Tensor& t) {
    if (collectives.replica_sum_in_place) collectives.replica_sum_in_place(t);
  };
  const ops::MatmulPrecision range =
      s.tf32 ? ops::MatmulPrecision::tf32 : ops::MatmulPrecision::fp32;
  const SumInPlace& over_shards = collectives.sum_in_place;
  Tensor y = galore_scratch(g, {rows, l}, scratch);
  {
    Tensor omega = galore_scratch(g, {n, l}, scratch);
    ops::galore_sketch(omega, seed);  // drawn where G lives: no host work, no upload
    ops::matmul(y, g, false, omega, false, 1.0f, 0.0f, range);
  }
  over_replicas(y);
  for (int pass = 0, passes = 2; pass < passes; ++pass) {  // CholeskyQR of Y
    const auto p = start_pass(y, false, over_shards, scratch);
    co_await factor_stage(*p);
    if (p->shifted) passes = 3;
    finish_pass(y, false, *p, scratch);
  }
  for (int64_t q = 0; q < s.power_iterations; ++q) {
    Tensor z = galore_scratch(g, {n, l}, scratch);
    ops::matmul(z, g, true, y, false, 1.0f, 0.0f, range);
    collectives.sum_in_place(z);
    over_replicas(z);
    for (int pass = 0, passes = 2; pass < passes; ++pass) {  // CholeskyQR of Z (whole)
      const auto p = start_pass(z, false, kReplicated, scratch);
      co_await factor_stage(*p);
      if (p->shifted) passes = 3;
      finish_pass(z, false, *p, scratch);
    }
    ops::matmul(y, g, false, z, false, 1.0f, 0.0f, range);
    over_replicas(y);
    for (int pass = 0, passes = 2; pass < passes; ++pass) {  // CholeskyQR of Y
      const auto p = start_pass(y, false, over_shards, scratch);
      co_await factor_stage(*p);
      if (p->shifted) passes = 3;
      finish_pass(y, false, *p, scratch);
    }
  }
  Tensor b = galore_scratch(g, {l, n}, scratch);
  ops::matmul(b, y, true, g, false);
  collectives.sum_in_place(b);
  over_replicas(b);
  g = Tensor();  // the gradient's last use: a snapshot of it is freed here
  Tensor bbt = galore_scratch(b, {l, l}, scratch);
  ops::matmul(bbt, b, false, b, true);
  Download bbt_host(bbt, scratch);
  TopSingular top(l, rank, scratch);  // rows: columns of W
  {
    std::vector<ops::SideCopy> copies;
    copies.push_back(std::move(bbt_host.copy));
    co_await host_stage(std::move(copies), [&] {
      bbt_host.widen();
      top.compute(bbt_host.host64);
    });
  }
  if (galore_side(full) == GaloreSide::left) {
    // P = Y W_r: with W_r's columns the rows of top.vectors, Y [rows, l] times top.vectors^T.
    ops::matmul(projector, y, false, f32_beside(top.vectors, y, scratch), true);
    co_return;
  }
  Tensor w_over_s = top.vectors.clone();  // rows S^-1 W^T
  for (int64_t j = 0; j < rank; ++j) {
    const double inverse = top.values[size_t(j)] > 0 ? 1.0 / top.values[size_t(j)] : 0.0;
    for (int64_t i = 0; i < l; ++i) w_over_s.data<double>()[j * l + i] *= inverse;
  }
  ops::matmul(projector, f32_beside(w_over_s, b, scratch), false, b, false);
  for (int pass = 0, passes = 2; pass < passes; ++pass) {  // CholeskyQR of Q's rows
    const auto p = start_pass(projector, true, kReplicated, scratch);
    co_await factor_stage(*p);
    if (p->shifted) passes = 3;
    finish_pass(projector, true, *p, scratch);
  }
}

}  // namespace

int64_t galore_refresh_stages(const Shape& full_shape, const GaloreProjectorSettings& settings) {
  if (settings.kind == GaloreProjectorKind::svd) return 1;
  const int64_t right = galore_side(full_shape) == GaloreSide::right ? 2 : 0;
  return 2 + 4 * settings.power_iterations + 1 + right;
}

ProjectorRefresh galore_projector_refresh(Tensor projector, Tensor grad_rows, Shape full_shape,
                                          GaloreProjectorSettings settings, uint64_t sketch_seed,
                                          StepCollectives collectives, Arena& scratch) {
  const GaloreSide side = galore_side(full_shape);
  const int64_t m = full_shape[0], n = full_shape[1], r = settings.rank;
  FRUGAL_CHECK(r >= 1 && r <= std::min(m, n), "GaLore rank ", r, " for a ",
               shape_string(full_shape), " matrix");
  FRUGAL_CHECK(grad_rows.ndim() == 2 && grad_rows.size(1) == n && grad_rows.dtype() == DType::f32,
               "GaLore gradient rows ", shape_string(grad_rows.shape()), " of ",
               shape_string(full_shape));
  const Shape expected = side == GaloreSide::right ? Shape{r, n} : Shape{grad_rows.size(0), r};
  FRUGAL_CHECK(projector.shape() == expected && projector.dtype() == DType::f32,
               "GaLore projector ", shape_string(projector.shape()), ", expected ",
               shape_string(expected));
  ProjectorRefresh refresh =
      settings.kind == GaloreProjectorKind::svd
          ? exact_projector(projector, grad_rows, full_shape, r, collectives, scratch)
          : randomized_projector(projector, grad_rows, full_shape, settings, sketch_seed,
                                 collectives, scratch);
  refresh.rethrow();
  return refresh;
}

void galore_projector(Tensor& projector, const Tensor& grad_rows, const Shape& full_shape,
                      const GaloreProjectorSettings& settings, uint64_t sketch_seed,
                      const StepCollectives& collectives, Arena& scratch) {
  galore_projector_refresh(projector, grad_rows, full_shape, settings, sketch_seed, collectives,
                           scratch)
      .finish();
}

}  // namespace frugal
