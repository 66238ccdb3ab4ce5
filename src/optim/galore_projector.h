// GaLore's projector (Zhao et al. 2024; galore-torch's GaLoreProjector, proj_type std): the
// rank-r subspace of one weight matrix's gradient that Adam's moments live in, computed from
// ZeRO-3 row shards of the gradient, so that no rank ever holds a whole gradient.
//
// A gradient G [m, n] is projected on its smaller side, as the reference does:
//   right (m >= n): Q [r, n], orthonormal rows (the top right singular vectors);
//                   projected R = G Q^T [m, r], row-local; the step goes back as N Q.
//   left  (m < n):  P [m, r], orthonormal columns (the top left singular vectors);
//                   projected R = P^T G [r, n], a sum over the row shards; back as P N.
// Each rank holds rows [first, last) of G; the projector's products are computed on those rows
// and summed over the ranks (StepCollectives::sum_in_place). Q is replicated; P is row-sharded
// like G.
#pragma once

#include <algorithm>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <functional>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"
#include "optim/galore_modes.h"
#include "optim/optimizer.h"

namespace frugal {

enum class GaloreSide { right, left };
// The reference's rule: the right side when m >= n (the projected side is the smaller one).
GaloreSide galore_side(const Shape& full_shape);
// The rank of matrix [m, n]'s subspace: galore.rank, or min(m, n) for a matrix with fewer
// dimensions (galore-torch's SVD then yields min(m, n) vectors, and its slice [:rank] takes them
// all: TinyLlama's k and v projections [256, 2048] at rank 512).
inline int64_t galore_rank_of(const Shape& full_shape, int64_t rank) {
  return std::min({rank, full_shape[0], full_shape[1]});
}

struct GaloreProjectorSettings {
  GaloreProjectorKind kind = GaloreProjectorKind::randomized;
  int64_t rank = 128;
  int64_t oversampling = 8;      // randomized: sketch columns beyond the rank
  int64_t power_iterations = 1;  // randomized: passes of (G G^T) that sharpen the spectrum
  // On a GPU, the products with the whole gradient that only find a range (G Omega, G^T Y,
  // G Z) and the optimizer's per-step projections run in TF32 (ops::MatmulPrecision); the Gram
  // matrices, B = Y^T G and the exact projector stay fp32. No effect on the CPU.
  bool tf32 = false;
};

// The projector of the gradient whose rows [first, last) of `full_shape` [m, n] this rank holds
// in `grad_rows` ([last - first, n], f32): a collective of every rank holding rows of it (each
// calls it alike, in the same order). Writes `projector`: right side Q [r, n] (the same on every
// rank), left side this rank's rows of P [last - first, r]. Singular vectors' signs are fixed
// (svd: the largest component of each right singular vector is positive, the first of equal
// ones; randomized: likewise for the eigenvectors of the small B B^T).
// `sketch_seed` draws the randomized sketch, a function of it and of the full shape alone, so
// that any number of ranks computes the same subspace. `scratch` takes the temporaries of host
// tensors (device tensors use the device's compute memory).
void galore_projector(Tensor& projector, const Tensor& grad_rows, const Shape& full_shape,
                      const GaloreProjectorSettings& settings, uint64_t sketch_seed,
                      const StepCollectives& collectives, Arena& scratch);

// The host half of one stage of a refresh: device-to-host copies of small results, then float64
// factorisations of them (Cholesky, triangular inverse, eigen-decomposition) on host buffers the
// stage allocated. `math` calls no ops and no device API, so it may run on a worker thread.
struct RefreshHostWork {
  std::vector<ops::SideCopy> copies;  // finish (done()) before math reads their destinations
  std::function<void()> math;
  void run_here() {  // the copies finished, then the math, on this thread
    for (ops::SideCopy& c : copies) c.done();
    if (math) math();
  }
};

// A projector's computation split at its host factorisations (a C++20 coroutine). Made, it runs
// its device products (and their sums over the ranks) up to its first host stage; after that
// stage's host_work() is complete, resume() runs the next device products, up to the next host
// stage or the end, when the projector is written. Every rank must resume its refreshes alike.
class ProjectorRefresh {
 public:
  struct promise_type {
    RefreshHostWork host_work;
    std::exception_ptr error;
    ProjectorRefresh get_return_object() {
      return ProjectorRefresh(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { error = std::current_exception(); }
  };
  ProjectorRefresh() = default;
  explicit ProjectorRefresh(std::coroutine_handle<promise_type> h) : handle_(h) {}
  ProjectorRefresh(ProjectorRefresh&& o) noexcept : handle_(std::exchange(o.handle_, {})) {}
  ProjectorRefresh& operator=(ProjectorRefresh&& o) noexcept {
    if (this != &o) {
      if (handle_) handle_.destroy();
      handle_ = std::exchange(o.handle_, {});
    }
    return *this;
  }
  ~ProjectorRefresh() {
    if (handle_) handle_.destroy();
  }
  bool active() const { return bool(handle_); }
  bool done() const { return !handle_ || handle_.done(); }
  // The pending stage's host work (valid until resume()).
  RefreshHostWork& host_work() { return handle_.promise().host_work; }
  void resume() {
    handle_.promise().host_work = {};
    handle_.resume();
    rethrow();
  }
  // Throws what the coroutine threw, if it did.
  void rethrow() {
    if (handle_ && handle_.promise().error) std::rethrow_exception(handle_.promise().error);
  }
  // Every remaining stage now, the host work on this thread.
  void finish() {
    while (!done()) {
      host_work().run_here();
      resume();
    }
  }

 private:
  std::coroutine_handle<promise_type> handle_;
};

// galore_projector as a ProjectorRefresh (galore_projector is this, finished at once). It keeps
// `projector` and `grad_rows` (a snapshot when the refresh outlives the step) until it is done.
ProjectorRefresh galore_projector_refresh(Tensor projector, Tensor grad_rows, Shape full_shape,
                                          GaloreProjectorSettings settings, uint64_t sketch_seed,
                                          StepCollectives collectives, Arena& scratch);
// How many host stages a refresh of a matrix of `full_shape` has when no CholeskyQR needs its
// shifted third pass (svd: 1; randomized: 2 per orthonormalization, 1 eigen-decomposition).
int64_t galore_refresh_stages(const Shape& full_shape, const GaloreProjectorSettings& settings);

// Helpers shared with the optimizer: a tensor of `shape` (f32 unless said) where `like` lives,
// in `scratch` for host tensors; the host float64 copy of an f32 tensor; and an f64 host tensor
// as f32 where `like` lives.
Tensor galore_scratch(const Tensor& like, const Shape& shape, Arena& scratch,
                      DType dtype = DType::f32);
Tensor host_f64(const Tensor& t);
Tensor f32_beside(const Tensor& host_f64_tensor, const Tensor& like, Arena& scratch);

}  // namespace frugal
