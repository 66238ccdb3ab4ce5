// GaLore on ZeRO-3 row shards over MPI (run under 1, 2, 4 and 8 ranks): every rank's rows equal
// those of the same optimizer run on whole matrices by one rank (exact and randomized projectors,
// each moments_on_refresh, staggered refreshes; shards of one row, of none, and padded); a save
// and resume continues bit for bit; and a checkpoint written by these ranks loads on one rank,
// and one written by one rank loads on these, row for row exactly.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "ckpt/checkpoint_manager.h"
#include "core/random.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "optim/galore_adamw.h"
#include "parallel/comm.h"
#include "test_support.h"
#include "train/train_step.h"

using namespace frugal;
namespace fs = std::filesystem;

namespace {

// Right-side, left-side and square block matrices, one with fewer rows than 8 ranks (some
// ranks hold none of it), and a norm weight that takes AdamW.
const std::vector<std::pair<std::string, Shape>> kParams = {
    {"model.layers.0.self_attn.q_proj.weight", {30, 12}},
    {"model.layers.0.mlp.down_proj.weight", {13, 31}},
    {"model.layers.0.mlp.up_proj.weight", {7, 5}},
    {"model.layers.1.self_attn.o_proj.weight", {11, 11}},
    {"model.layers.0.input_layernorm.weight", {12}},
};
constexpr int64_t kRank = 3;
constexpr double kPadding = 7.0;  // what padded weight rows hold: never to be touched

struct RowRange {
  int64_t first = 0, last = 0, buffer = 0;
};
RowRange rows_of(int64_t rows, int rank, int ranks) {
  const int64_t shard = (rows + ranks - 1) / ranks;
  return {std::min(rows, rank * shard), std::min(rows, (rank + 1) * shard), shard};
}

// The whole of a parameter or of its step-t gradient (a decaying spectrum plus noise), the same
// on every rank.
Tensor whole(const std::string& name, const Shape& shape, int64_t t) {
  uint64_t seed = 0x5EED;
  for (char ch : name) seed = seed * 131 + uint8_t(ch);
  seed = seed * 1000003 + uint64_t(t);
  Tensor x = Tensor::empty(shape, DType::f32);
  const int64_t m = shape[0], n = shape.size() > 1 ? shape[1] : 1;
  uint64_t state = seed;
  auto uniform = [&] { return 2.0 * uniform01(state) - 1.0; };
  if (t == 0) {
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(0.1 * uniform());
    return x;
  }
  std::vector<double> u(size_t(m * 3)), v(size_t(n * 3));
  for (double& e : u) e = uniform();
  for (double& e : v) e = uniform();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.02 * uniform();
      for (int c = 0; c < 3; ++c)
        sum += std::pow(0.5, c) * u[size_t(i * 3 + c)] * v[size_t(j * 3 + c)];
      x.data<float>()[i * n + j] = float(sum);
    }
  return x;
}

// One rank's view of the parameters: its rows of each (the whole on one rank), padded.
struct Shards {
  std::vector<TrainableShard> shards;
  Shards(int rank, int ranks) {
    for (const auto& [name, shape] : kParams) {
      const RowRange r = rows_of(shape[0], rank, ranks);
      Shape buffer = shape;
      buffer[0] = r.buffer;
      TrainableShard s;
      s.name = name;
      s.param = Tensor::empty(buffer, DType::f32);
      s.grad = Tensor::zeros(buffer, DType::f32);
      for (int64_t i = 0; i < s.param.numel(); ++i) s.param.data<float>()[i] = float(kPadding);
      s.param.rows(0, r.last - r.first).copy_from(whole(name, shape, 0).rows(r.first, r.last));
      s.rows = {shape, r.first, r.last};
      shards.push_back(s);
    }
  }
  void set_gradients(int64_t t) {
    for (TrainableShard& s : shards)
      s.grad.rows(0, s.rows.last_row - s.rows.first_row)
          .copy_from(whole(s.name, s.rows.full_shape, t).rows(s.rows.first_row, s.rows.last_row));
  }
};

// The weights as checkpoint state.
struct Weights : Stateful {
  std::vector<TrainableShard>* shards;
  explicit Weights(std::vector<TrainableShard>& s) : shards(&s) {}
  std::vector<StateTensor> state_tensors() override {
    std::vector<StateTensor> state;
    for (TrainableShard& s : *shards) state.push_back({"weights/" + s.name, s.param, s.rows});
    return state;
  }
};

GaloreConfig config(GaloreProjectorKind kind, MomentsOnRefresh moments,
                    GaloreRefresh refresh = GaloreRefresh::immediate) {
  GaloreConfig g;
  g.refresh = refresh;
  g.projector.kind = kind;
  g.projector.rank = kRank;
  g.projector.oversampling = 3;
  g.update_proj_gap = 3;
  g.scale = 0.5;
  g.moments_on_refresh = moments;
  g.stagger = true;
  g.seed = 99;
  return g;
}

// int8: optim.state_dtype = int8 with every matrix's moments 8-bit (min_8bit_size lowered to
// one value for these small matrices).
AdamWConfig adamw(bool int8 = false) {
  AdamWConfig c{0.9, 0.95, 1e-8, 0.1, 2.0};
  c.int8_state = int8;
  c.int8_min_elements = 1;
  return c;
}

// A state tensor's values as floats (8-bit codes widened).
std::vector<float> floats(const Tensor& t) {
  const Tensor host = ops::to_host_f32(t);
  return std::vector<float>(host.data<float>(), host.data<float>() + host.numel());
}

void run_steps(GaloreAdamW& optimizer, Shards& shards, int64_t first, int64_t last,
               const StepCollectives& collectives) {
  for (int64_t t = first; t <= last; ++t) {
    shards.set_gradients(t);
    optimizer.step(0.02, t, collectives);
  }
}

// Every state tensor's live rows, for bitwise comparisons.
std::vector<std::vector<float>> state_rows(GaloreAdamW& optimizer, Shards& shards) {
  std::vector<std::vector<float>> out;
  auto add = [&](const StateTensor& s) {
    const int64_t rows = s.rows.replicated ? s.tensor.size(0) : s.rows.last_row - s.rows.first_row;
    out.push_back(floats(s.tensor.rows(0, rows)));
  };
  for (const StateTensor& s : optimizer.state_tensors()) add(s);
  for (const StateTensor& s : Weights(shards.shards).state_tensors()) add(s);
  return out;
}

bool agree_over(Comm& comm, bool ok) { return comm.all_reduce_max(ok ? 0 : 1) == 0; }

}  // namespace

TEST_CASE("GaLore on row shards equals GaLore on whole matrices", "[galore][mpi]") {
  auto comm = make_mpi_world_comm(60);
  const int rank = comm->rank(), ranks = comm->size();
  const StepCollectives collectives = step_collectives(comm.get());
  struct Case {
    GaloreRefresh refresh;
    GaloreProjectorKind kind;
    MomentsOnRefresh moments;
    GaloreProjectionPrecision precision;
  };
  std::vector<Case> cases;
  for (GaloreRefresh refresh : {GaloreRefresh::immediate, GaloreRefresh::pipelined})
    for (GaloreProjectorKind kind : {GaloreProjectorKind::svd, GaloreProjectorKind::randomized})
      for (MomentsOnRefresh moments :
           {MomentsOnRefresh::keep, MomentsOnRefresh::project, MomentsOnRefresh::reset})
        if (refresh != GaloreRefresh::pipelined || moments != MomentsOnRefresh::reset)
          cases.push_back({refresh, kind, moments, GaloreProjectionPrecision::fp32});
  // bf16 operands: the shards' products are exact, their sums fp32, as on one rank.
  for (GaloreProjectorKind kind : {GaloreProjectorKind::svd, GaloreProjectorKind::randomized})
    cases.push_back(
        {GaloreRefresh::pipelined, kind, MomentsOnRefresh::keep, GaloreProjectionPrecision::bf16});
  for (const auto& [refresh, kind, moments, precision] : cases) {
    INFO(enum_name(kind) << ", moments " << enum_name(moments) << ", refresh " << enum_name(refresh)
                         << ", " << enum_name(precision) << ", " << ranks << " ranks");
    GaloreConfig galore = config(kind, moments, refresh);
    galore.precision = precision;
    Shards whole_shards(0, 1), sharded(rank, ranks);
    GaloreAdamW one(whole_shards.shards, adamw(), galore);
    GaloreAdamW many(sharded.shards, adamw(), galore);
    run_steps(one, whole_shards, 1, 10, local_collectives());
    run_steps(many, sharded, 1, 10, collectives);
    double worst = 0, moved = 0;
    for (size_t k = 0; k < kParams.size(); ++k) {
      const TrainableShard& a = whole_shards.shards[k];
      const TrainableShard& b = sharded.shards[k];
      const int64_t local = b.rows.last_row - b.rows.first_row;
      const int64_t row_len = a.param.numel() / a.param.size(0);
      const Tensor expected = a.param.rows(b.rows.first_row, b.rows.last_row);
      const Tensor initial = whole(a.name, a.rows.full_shape, 0);
      for (int64_t i = 0; i < local * row_len; ++i) {
        worst =
            std::max(worst, double(std::abs(b.param.data<float>()[i] - expected.data<float>()[i])));
        moved = std::max(moved,
                         double(std::abs(expected.data<float>()[i] -
                                         initial.data<float>()[b.rows.first_row * row_len + i])));
      }
      // Padding rows of the projected matrices are never written.
      if (k + 1 < kParams.size())
        for (int64_t i = local * row_len; i < b.param.numel(); ++i)
          CHECK(b.param.data<float>()[i] == float(kPadding));
    }
    worst = comm->all_reduce_max(int64_t(worst * 1e12)) * 1e-12;
    moved = comm->all_reduce_max(int64_t(moved * 1e12)) * 1e-12;
    if (rank == 0)
      std::printf(
          "galore %s, moments %s, refresh %s, %s, %d rank(s): weights moved up to %.3g, off "
          "the one-rank run by at most %.3g\n",
          std::string(enum_name(kind)).c_str(), std::string(enum_name(moments)).c_str(),
          std::string(enum_name(refresh)).c_str(), std::string(enum_name(precision)).c_str(), ranks,
          moved, worst);
    CHECK(moved > 0.05);
    CHECK(worst < 5e-6);
  }
}

TEST_CASE("GaLore's checkpoint: resume bit for bit, and onto another number of ranks",
          "[galore][mpi][ckpt]") {
  auto comm = make_mpi_world_comm(60);
  const int rank = comm->rank(), ranks = comm->size();
  const StepCollectives collectives = step_collectives(comm.get());
  const auto agree = [&comm](bool ok) { return agree_over(*comm, ok); };
  const auto alone = [](bool ok) { return ok; };
  // A manager of these ranks, made by all of them before any uses it: rank 0's constructor
  // clears temporary files, which must not be those of another rank's save in progress.
  const auto manager = [&](const std::string& dir, std::vector<CheckpointManager::Part> parts) {
    auto m = std::make_unique<CheckpointManager>(CheckpointDir(dir), rank, ranks, agree,
                                                 std::move(parts), 2);
    comm->barrier();
    return m;
  };
  // One directory for every rank: rank 0 makes it and says where.
  std::string root;
  if (rank == 0) {
    char name[] = "/tmp/frugal-galore-XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr);
    root = name;
  }
  root = comm->broadcast_string(root, 0);

  // 8-bit state (optim.state_dtype = int8): its codes and block scales resharded by rows too.
  for (const bool int8 : {false, true})
    for (GaloreRefresh refresh : {GaloreRefresh::immediate, GaloreRefresh::pipelined})
      for (GaloreProjectorKind kind : {GaloreProjectorKind::svd, GaloreProjectorKind::randomized}) {
        if (int8 && refresh == GaloreRefresh::pipelined) continue;
        INFO(enum_name(kind) << ", refresh " << enum_name(refresh) << ", " << ranks << " ranks"
                             << (int8 ? ", int8 state" : ""));
        const GaloreConfig g = config(kind, MomentsOnRefresh::project, refresh);
        const std::string dir = root + "/" + std::string(enum_name(kind)) + "-" +
                                std::string(enum_name(refresh)) + (int8 ? "-int8" : "");
        const auto adamw = [int8] { return ::adamw(int8); };

        // Straight through, and saved at step 5 then resumed into fresh objects. A pipelined run
        // completes its refreshes in flight when it saves: the straight run does what a save does.
        Shards straight(rank, ranks);
        GaloreAdamW straight_opt(straight.shards, adamw(), g);
        run_steps(straight_opt, straight, 1, 5, collectives);
        if (refresh == GaloreRefresh::pipelined) straight_opt.before_save();
        run_steps(straight_opt, straight, 6, 10, collectives);

        Shards first(rank, ranks);
        GaloreAdamW first_opt(first.shards, adamw(), g);
        Weights first_weights(first.shards);
        run_steps(first_opt, first, 1, 5, collectives);
        manager(dir + "/many", {{"optim", &first_opt}, {"weights", &first_weights}})->save(5);

        Shards resumed(rank, ranks);
        GaloreAdamW resumed_opt(resumed.shards, adamw(), g);
        Weights resumed_weights(resumed.shards);
        manager(dir + "/many", {{"optim", &resumed_opt}, {"weights", &resumed_weights}})->load(5);
        CHECK(state_rows(resumed_opt, resumed) == state_rows(first_opt, first));
        run_steps(resumed_opt, resumed, 6, 10, collectives);
        CHECK(state_rows(resumed_opt, resumed) == state_rows(straight_opt, straight));

        // These ranks' checkpoint on one rank: the whole state, whose rows are each rank's exactly.
        Shards on_one(0, 1);
        GaloreAdamW on_one_opt(on_one.shards, adamw(), g);
        Weights on_one_weights(on_one.shards);
        CheckpointManager(CheckpointDir(dir + "/many"), 0, 1, alone,
                          {{"optim", &on_one_opt}, {"weights", &on_one_weights}}, 2)
            .load(5);
        const std::vector<StateTensor> whole_state = on_one_opt.state_tensors();
        const std::vector<StateTensor> my_state = first_opt.state_tensors();
        REQUIRE(whole_state.size() == my_state.size());
        for (size_t i = 0; i < my_state.size(); ++i) {
          const StateTensor& mine = my_state[i];
          INFO(mine.name);
          CHECK(whole_state[i].name == mine.name);
          const int64_t first_row = mine.rows.replicated ? 0 : mine.rows.first_row;
          const int64_t last_row = mine.rows.replicated ? mine.tensor.size(0) : mine.rows.last_row;
          CHECK(floats(mine.tensor.rows(0, last_row - first_row)) ==
                floats(whole_state[i].tensor.rows(first_row, last_row)));
        }

        // One rank's checkpoint (rank 0 saves its whole run at step 5) on these ranks.
        if (rank == 0) {
          Shards alone_shards(0, 1);
          GaloreAdamW alone_opt(alone_shards.shards, adamw(), g);
          Weights alone_weights(alone_shards.shards);
          run_steps(alone_opt, alone_shards, 1, 5, local_collectives());
          CheckpointManager(CheckpointDir(dir + "/one"), 0, 1, alone,
                            {{"optim", &alone_opt}, {"weights", &alone_weights}}, 2)
              .save(5);
        }
        comm->barrier();
        Shards from_one(rank, ranks);
        GaloreAdamW from_one_opt(from_one.shards, adamw(), g);
        Weights from_one_weights(from_one.shards);
        manager(dir + "/one", {{"optim", &from_one_opt}, {"weights", &from_one_weights}})->load(5);
        // ... and trains on as the ranks that never stopped, to the rounding of the sums.
        run_steps(from_one_opt, from_one, 6, 10, collectives);
        double worst = 0;
        for (size_t k = 0; k < kParams.size(); ++k) {
          const Tensor& a = from_one.shards[k].param;
          const Tensor& b = straight.shards[k].param;
          for (int64_t i = 0; i < a.numel(); ++i)
            worst = std::max(worst, double(std::abs(a.data<float>()[i] - b.data<float>()[i])));
        }
        worst = comm->all_reduce_max(int64_t(worst * 1e12)) * 1e-12;
        if (rank == 0)
          std::printf(
              "galore %s%s: resumed from a one-rank checkpoint on %d rank(s), off the ranks "
              "that never stopped by at most %.3g after 5 more steps\n",
              std::string(enum_name(kind)).c_str(), int8 ? " (int8 state)" : "", ranks, worst);
        CHECK(worst < 5e-6);
        comm->barrier();  // every rank has read the checkpoints before the next case
      }
  comm->barrier();
  if (rank == 0) fs::remove_all(root);
}
