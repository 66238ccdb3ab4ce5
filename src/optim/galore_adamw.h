// GaLore AdamW (Zhao et al. 2024; galore-torch's GaLoreAdamW): the blocks' attention and MLP
// matrices keep Adam's moments in a rank-r subspace of their gradient, refreshed every
// update_proj_gap steps; every other parameter (embeddings, norms, the head) takes frugal's
// AdamW. Works on ZeRO-3 row shards: every product that needs more than this rank's rows is
// summed over the ranks in begin_step, so no rank holds a whole gradient, and update(k) is
// local (it may run on a thread of its own, as AdamW's does under offload).
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"
#include "model/parameter_provider.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/galore_projector.h"
#include "optim/host_worker.h"
#include "optim/optimizer.h"

namespace frugal {

class Progress;  // core/progress.h

struct GaloreConfig {
  GaloreProjectorSettings projector;
  int64_t update_proj_gap = 200;
  double scale = 0.25;  // the projected-back step is multiplied by it (the reference's scale)
  MomentsOnRefresh moments_on_refresh = MomentsOnRefresh::keep;
  // Spread the refreshes over the gap: matrix j of J refreshes at the steps t (0-based) with
  // t % gap == j * gap / J, besides t = 0; off, every matrix refreshes at t % gap == 0 (the
  // reference's schedule, whose refresh steps cost all the SVDs at once).
  bool stagger = true;
  uint64_t seed = 0;  // of the randomized sketches
  // inline: a refresh due at step t is computed within step t (galore-torch's schedule).
  // pipelined: it starts at step t from G_t (a snapshot of this rank's gradient rows) and runs
  // one host stage per step on a worker thread; its projector is installed at the start of step
  // t + galore_refresh_stages(...) (earlier if the matrix's next refresh is due first, or at the
  // end of a step that saves a checkpoint); until then the old projector serves. The first
  // projectors (t = 0) are computed inline: there is no old one. moments_on_refresh = reset
  // needs inline (its bias correction counts from the refresh step).
  GaloreRefresh refresh = GaloreRefresh::immediate;
  // Hybrid sharding (StepCollectives::replicas > 1): the projected matrices' gradient shards are
  // one replica's sums, and what crosses the replicas is their projections R (r x n or m x r
  // instead of m x n; exact, the projection being linear) and the randomized refreshes' small
  // products; an exact (svd) refresh sums its matrix's whole gradient rows. The gradient norm
  // then counts a projected matrix by its projected gradient's norm (the whole gradient's sum
  // is nowhere). False: every gradient shard arrives summed over the replicas.
  bool projected_replica_sums = false;
  // The per-step projections' operands (galore_modes.h); fp32 here, where the tests compare with
  // galore-torch's fp32 arithmetic. It also sets the range finder's TF32 (projector.tf32 is
  // derived from it, not read).
  GaloreProjectionPrecision precision = GaloreProjectionPrecision::fp32;
  // Time GaLore's device work with timing events (ops::TimeMark): take_profile() reports the
  // mean milliseconds per step of the refreshes, the projections (R and the step back) and
  // Adam on the projected moments with the weight update.
  bool profile = false;
};

// The step (mod update_proj_gap) at which the j-th of `count` projected matrices refreshes:
// spread evenly over the gap with stagger, else all at 0.
int64_t galore_refresh_phase(int64_t j, int64_t count, const GaloreConfig& config);

// Whether GaLore projects a parameter: the blocks' attention and MLP matrices (q, k, v, o, gate,
// up, down projections), as the reference's training script selects them.
bool galore_projects(const std::string& name, const Shape& shape);

class GaloreAdamW : public Optimizer {
 public:
  GaloreAdamW(std::vector<TrainableShard> shards, const AdamWConfig& adamw,
              const GaloreConfig& galore, Arena& state_arena = host_arena());
  ~GaloreAdamW() override;  // waits for host work still reading refreshes' buffers

  // The global norm and clipping factor, the refreshes due at this step, and the left-side
  // projections P^T G (each a sum over the ranks).
  StepReport begin_step(double lr, int64_t step, const StepCollectives& collectives) override;
  void update(size_t k) override;
  size_t slices() const override { return shards_.size(); }
  // Per-layer updates: the refreshes due among a unit's matrices and their left projections,
  // as begin_step makes them for all (inline refreshes only: the config refuses pipelined ones
  // and projected replica sums with per-layer updates).
  void begin_per_layer_step(double lr, int64_t step) override;
  void begin_slices(const std::vector<size_t>& slices, double clip_scale,
                    const StepCollectives& collectives) override;
  using Optimizer::step;

  // "optim/galore/exp_avg/<name>", "optim/galore/exp_avg_sq/<name>" and
  // "optim/galore/projector/<name>" of the projected matrices (row-sharded like the weight on
  // the right side, replicated on the left side but for P), "optim/exp_avg/<name>" and
  // "optim/exp_avg_sq/<name>" of the rest, as AdamW names them.
  // With optim.state_dtype = int8 an 8-bit moment is "<its name>.codes" and "<its name>.absmax"
  // (optim/quantized_moments.h).
  std::vector<StateTensor> state_tensors() override;
  nlohmann::json state_values() const override;
  // pipelined: the refreshes in flight are completed and installed now, so that a checkpoint
  // holds no half-made projector (the saved run and the resumed one go on alike).
  void before_save() override;
  void load_state_values(const nlohmann::json& values) override;
  // galore.profile: {"steps", "refreshes", "refresh_ms", "projection_ms", "moments_ms"}, the
  // milliseconds per step over the steps since the last call (waits for their work).
  nlohmann::json take_profile() override;

  // This rank's optimizer state, and what AdamW's two moments of the same shards would take.
  struct StateBytes {
    size_t projected_moments = 0, projectors = 0, adamw_moments = 0;
    size_t adamw_equivalent = 0;
    size_t total() const { return projected_moments + projectors + adamw_moments; }
  };
  StateBytes state_bytes() const;
  size_t projected_matrices() const { return matrices_.size(); }
  // Where its temporaries of host tensors go (all of them on the CPU backend): tests compare its
  // peak with galore_working_bytes.
  const Arena& scratch() const { return *scratch_; }

  // Whether matrix j (0-based among the projected ones) refreshes its projector at 0-based
  // iteration t, and the last iteration <= t at which it did.
  bool refresh_due(size_t j, int64_t t) const;
  int64_t last_refresh(size_t j, int64_t t) const;

 private:
  struct Matrix {
    size_t shard = 0;  // in shards_
    GaloreSide side = GaloreSide::right;
    int64_t rows = 0, cols = 0;  // the full matrix
    int64_t rank = 0;            // its subspace's (galore_rank_of)
    int64_t local_rows = 0;      // rows this rank holds (the rest of the buffer is padding)
    int64_t phase = 0;           // refreshes when t % gap == phase
    Tensor exp_avg, exp_avg_sq;  // right: [buffer rows, r] like the weight; left: [r, n]
    // optim.state_dtype = int8 (where int8_moments_apply to the moments' whole shape): the
    // moments in 8 bits instead, exp_avg and exp_avg_sq undefined.
    ops::QuantizedMoment exp_avg_int8, exp_avg_sq_int8;
    Tensor projector;            // right: Q [r, n]; left: P [buffer rows, r]
    Tensor projected_grad;       // left: this step's P^T G [r, n], made by begin_step (right:
                                 // G Q^T, made there too under projected_replica_sums)
    int64_t stages = 0;          // pipelined: steps from a refresh's start to its installation
    Tensor projector_operand;    // this step's projector (rows) as the products take it
  };
  // A pipelined refresh in flight: its coroutine (holding G_t's snapshot while it needs it), the
  // projector it writes, and the host work of its current stage running on the worker.
  struct InFlight {
    ProjectorRefresh refresh;
    Tensor new_projector;
    std::future<void> host;
    std::vector<ops::SideCopy> copies;  // the current stage's downloads, until its host work ran
    int64_t stages_done = 0;
    StepCollectives collectives;
  };

  // The f32 view of this rank's gradient rows of matrix x (a copy for a bf16 run).
  Tensor gradient_rows(const Matrix& x);
  // The operands of the per-step products at galore.precision: bf16 copies (the gradient's own
  // rows if they are bf16) or the f32 tensors; and x's projection of its gradient rows into
  // `out`: R = alpha G Q^T (right) or this rank's part alpha P^T G of the left side's sum.
  Tensor gradient_operand(const Matrix& x);
  Tensor operand(const Tensor& t);
  const Tensor& projector_operand(Matrix& x);  // converted once a step, kept till the update
  void project(Tensor& out, Matrix& x, float alpha);
  // The left-side matrices among `js`: this step's P^T G, clipped, in one buffer summed over
  // the ranks.
  void project_left(const std::vector<size_t>& js, const StepCollectives& collectives);
  void refresh(Matrix& x, int64_t t, const StepCollectives& collectives);
  uint64_t sketch_seed(const Matrix& x, int64_t t) const;
  GaloreProjectorSettings settings_of(const Matrix& x) const;  // the projector's, at x's rank
  // pipelined: begins matrix j's refresh from G_t; advances every refresh in flight one stage
  // (installing those whose stages are done); hands their host work to the worker; completes
  // and installs refresh j now.
  void begin_refresh(size_t j, int64_t t, const StepCollectives& collectives);
  void advance_refreshes();
  void submit_host_work();
  void complete_refresh(size_t j);
  // The new projector replaces the old (rotating the moments with `project`).
  void install(Matrix& x, const Tensor& new_projector, const StepCollectives& collectives);
  // x's projector (this rank's rows of P on the left side) rewritten by `write`; with `rotate`
  // the moments are carried from the old subspace into the new one.
  void replace_projector(Matrix& x, bool rotate, const StepCollectives& collectives,
                         const std::function<void(Tensor&)>& write);
  bool pipelined(int64_t t) const { return galore_.refresh == GaloreRefresh::pipelined && t > 0; }
  // The refreshes step t computes inline (the first projectors; every refresh with refresh =
  // inline) take minutes on a large model (a 7B's 224 matrices at rank 1024, on the host with
  // offload): a progress line every 15 s while they run. Null when none is inline.
  using InlineProgress = std::unique_ptr<Progress>;
  InlineProgress inline_progress(int64_t t) const;
  // begin_step when the projected matrices' gradients are not summed over the replicas.
  StepReport begin_step_across_replicas(const StepCollectives& collectives);
  void rotate_moments(Matrix& x, const Tensor& old_projector, const StepCollectives& collectives);
  // An 8-bit moment of x as this rank's rows of it (right side) or the whole (left side).
  static ops::QuantizedMoment moment_rows(const Matrix& x, const ops::QuantizedMoment& q);
  void update_projected(Matrix& x);

  // galore.profile's spans of device work, by kind.
  enum class Work { refresh, projection, moments, kinds };
  ops::TimeMark mark() const;
  void timed(Work work, const ops::TimeMark& start);
  ops::MatmulPrecision precision() const;

  // Temporaries of host tensors: the optimizer's own, since update(k) may run on a thread of
  // its own beside the main thread's use of the host arena (page-locked on a GPU: the
  // constructor). Declared first, destroyed last.
  std::unique_ptr<Arena> scratch_ = std::make_unique<Arena>("GaLore scratch (host)", Device::cpu);
  std::vector<TrainableShard> shards_;
  AdamWConfig adamw_;
  GaloreConfig galore_;
  std::vector<Tensor> m_, v_;   // AdamW's moments of the shards not projected (else empty)
  std::vector<ops::QuantizedMoment> qm_, qv_;  // or their 8-bit moments (optim.state_dtype)
  std::vector<int> matrix_of_;  // shard -> index in matrices_, or -1
  std::vector<Matrix> matrices_;
  std::vector<std::unique_ptr<InFlight>> in_flight_;  // by matrix; null when none
  std::unique_ptr<HostWorker> worker_;                // pipelined only
  double lr_ = 0, clip_scale_ = 1;
  int64_t step_ = 0;
  struct Span {
    Work work;
    ops::TimeMark start, end;
  };
  std::mutex spans_mutex_;  // update(k) may run on threads of their own
  std::vector<Span> spans_;
  int64_t profiled_steps_ = 0, profiled_refreshes_ = 0;
};

}  // namespace frugal
