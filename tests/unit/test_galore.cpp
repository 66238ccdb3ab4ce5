// GaLore: the dense kernels against float64 loops, the optimizer against galore-torch's
// GaLoreAdamW on the same matrices and gradients (tests/fixtures/galore, written by
// tools/make_galore_fixtures.py), the randomized projector against the exact one (principal
// angles), the refresh schedule, and the checkpoint state's names and layout.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "ckpt/safetensors.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/cpu/dense.h"
#include "kernels/cpu/galore.h"
#include "model/llama_model.h"
#include "model/local_parameters.h"
#include "ops/ops.h"
#include "optim/galore_adamw.h"
#include "optim/galore_projector.h"
#include "optim_support.h"
#include "test_support.h"

namespace {

using frugal::test::whole_shard;

using namespace frugal;
namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(FRUGAL_SOURCE_DIR) / "tests" / "fixtures" / "galore";

Tensor random_tensor(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  uint64_t state = seed;
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = scale * float(2.0 * uniform01(state) - 1.0);
  return t;
}

// G = U diag(s) V^T + noise with s_i = 0.7^i: a gradient-like matrix with a decaying spectrum.
Tensor low_rank_plus_noise(int64_t m, int64_t n, uint64_t seed, double noise) {
  const int64_t k = std::min(m, n);
  const Tensor u = random_tensor({m, k}, seed), v = random_tensor({n, k}, seed + 1);
  const Tensor e = random_tensor({m, n}, seed + 2);
  Tensor g = Tensor::empty({m, n}, DType::f32);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t c = 0; c < k; ++c)
        sum += std::pow(0.7, double(c)) * u.data<float>()[i * k + c] * v.data<float>()[j * k + c];
      g.data<float>()[i * n + j] = float(sum + noise * e.data<float>()[i * n + j]);
    }
  return g;
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(double(a.data<float>()[i]) - double(b.data<float>()[i])));
  return worst;
}

double max_abs(const Tensor& a) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(double(a.data<float>()[i])));
  return worst;
}

// The cosines of the principal angles between the row spaces of a [r, n] and b [r, n] (both with
// orthonormal rows): the singular values of a b^T, here the square roots of the eigenvalues of
// (a b^T)(a b^T)^T, in float64.
std::vector<double> principal_cosines(const Tensor& a, const Tensor& b) {
  const int64_t r = a.size(0), n = a.size(1);
  std::vector<double> c(size_t(r * r), 0.0);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j)
      for (int64_t k = 0; k < n; ++k)
        c[size_t(i * r + j)] += double(a.data<float>()[i * n + k]) * b.data<float>()[j * n + k];
  Tensor cct = Tensor::zeros({r, r}, DType::f64), values = Tensor::empty({r}, DType::f64);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j)
      for (int64_t k = 0; k < r; ++k)
        cct.data<double>()[i * r + j] += c[size_t(i * r + k)] * c[size_t(j * r + k)];
  cpu::symmetric_eigen(cct.data<double>(), values.data<double>(), r);
  std::vector<double> cosines;
  for (int64_t i = r - 1; i >= 0; --i)
    cosines.push_back(std::sqrt(std::max(0.0, values.data<double>()[i])));
  return cosines;
}

}  // namespace

TEST_CASE("matmul of every transpose against a float64 loop, on awkward sizes", "[galore]") {
  const int64_t m = 37, n = 23, k = 19;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 11);
      const Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 12);
      Tensor c = random_tensor({m, n}, 13);
      const Tensor c0 = c.clone();
      ops::matmul(c, a, ta, b, tb, 0.5f, 0.25f);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0;
          for (int64_t p = 0; p < k; ++p)
            sum += double(ta ? a.data<float>()[p * m + i] : a.data<float>()[i * k + p]) *
                   double(tb ? b.data<float>()[j * k + p] : b.data<float>()[p * n + j]);
          const double expected = 0.5 * sum + 0.25 * c0.data<float>()[i * n + j];
          CHECK(std::abs(c.data<float>()[i * n + j] - expected) < 1e-5);
        }
    }
  // No rows to sum over (a rank without rows of a matrix): the product is zero.
  Tensor empty_rows = Tensor::empty({0, 5}, DType::f32);
  Tensor gram = random_tensor({5, 5}, 14);
  ops::matmul(gram, empty_rows, true, empty_rows, false);
  CHECK(max_abs(gram) == 0.0);
}

TEST_CASE("host products run with OpenBLAS single-threaded, whoever set it otherwise", "[galore]") {
  // A GPU run reaches these products (GaLore's under offload) without a host linear layer ever
  // having set OpenBLAS to one thread: with its thread per core inside each of OpenMP's
  // threads, the products asked for threads squared.
  openblas_set_num_threads(2);
  const Tensor a = random_tensor({64, 32}, 21), b = random_tensor({32, 48}, 22);
  Tensor c = Tensor::empty({64, 48}, DType::f32);
  ops::matmul(c, a, false, b, false);
  CHECK(openblas_get_num_threads() == 1);
}

TEST_CASE("float64 factorisations: eigen-decomposition, Cholesky, triangular inverse", "[galore]") {
  const int64_t n = 13;
  const Tensor x = random_tensor({n + 4, n}, 21);
  Tensor a = Tensor::zeros({n, n}, DType::f64);  // x^T x: symmetric positive definite
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < n + 4; ++p)
        a.data<double>()[i * n + j] +=
            double(x.data<float>()[p * n + i]) * x.data<float>()[p * n + j];
  const Tensor a0 = a.clone();
  auto at = [&](const Tensor& t, int64_t i, int64_t j) { return t.data<double>()[i * n + j]; };

  Tensor vectors = a0.clone(), values = Tensor::empty({n}, DType::f64);
  cpu::symmetric_eigen(vectors.data<double>(), values.data<double>(), n);
  for (int64_t e = 0; e < n; ++e) {
    if (e > 0) CHECK(values.data<double>()[e] >= values.data<double>()[e - 1]);
    double norm = 0;
    for (int64_t i = 0; i < n; ++i) {
      double av = 0;
      for (int64_t j = 0; j < n; ++j) av += at(a0, i, j) * at(vectors, e, j);
      CHECK(std::abs(av - values.data<double>()[e] * at(vectors, e, i)) < 1e-10);
      norm += at(vectors, e, i) * at(vectors, e, i);
    }
    CHECK(std::abs(norm - 1.0) < 1e-12);
  }

  Tensor r = a0.clone();
  REQUIRE(cpu::cholesky_upper(r.data<double>(), n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      if (j < i) CHECK(at(r, i, j) == 0.0);
      double rtr = 0;
      for (int64_t p = 0; p < n; ++p) rtr += at(r, p, i) * at(r, p, j);
      CHECK(std::abs(rtr - at(a0, i, j)) < 1e-10 * (1 + std::abs(at(a0, i, j))));
    }
  Tensor r_inverse = r.clone();
  cpu::invert_upper(r_inverse.data<double>(), n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double product = 0;
      for (int64_t p = 0; p < n; ++p) product += at(r, i, p) * at(r_inverse, p, j);
      CHECK(std::abs(product - (i == j ? 1.0 : 0.0)) < 1e-10);
    }

  Tensor indefinite = a0.clone();
  indefinite.data<double>()[0] = -1.0;
  CHECK_FALSE(cpu::cholesky_upper(indefinite.data<double>(), n));
}

TEST_CASE("GaLore's moments and weight update against float64 formulas", "[galore]") {
  const int64_t n = 1003;
  Tensor m = random_tensor({n}, 31, 0.1f), v = random_tensor({n}, 32, 0.01f);
  for (int64_t i = 0; i < n; ++i) v.data<float>()[i] = std::abs(v.data<float>()[i]);
  Tensor r = random_tensor({n}, 33);
  const Tensor m0 = m.clone(), v0 = v.clone(), r0 = r.clone();
  ops::galore_moments(m, v, r, 0.9f, 0.95f, 1e-8f);
  for (int64_t i = 0; i < n; ++i) {
    const double g = r0.data<float>()[i];
    const double mi = 0.9 * m0.data<float>()[i] + 0.1 * g;
    const double vi = 0.95 * v0.data<float>()[i] + 0.05 * g * g;
    CHECK(std::abs(m.data<float>()[i] - mi) < 1e-6 * (1 + std::abs(mi)));
    CHECK(std::abs(v.data<float>()[i] - vi) < 1e-6 * (1 + std::abs(vi)));
    const double step = mi / (std::sqrt(vi) + 1e-8);
    CHECK(std::abs(r.data<float>()[i] - step) < 1e-5 * (1 + std::abs(step)));
  }
  Tensor param = random_tensor({n}, 34);
  const Tensor param0 = param.clone(), delta = random_tensor({n}, 35);
  Tensor copy = Tensor::empty({n}, DType::bf16);
  ops::galore_apply(param, delta, -0.01f, -0.001f, copy);
  for (int64_t i = 0; i < n; ++i) {
    const double stepped = param0.data<float>()[i] - 0.01 * delta.data<float>()[i];
    CHECK(std::abs(param.data<float>()[i] - stepped * (1 - 0.001)) < 1e-6);
    CHECK(copy.data<uint16_t>()[i] == float_to_bf16(param.data<float>()[i]));
  }
}

TEST_CASE("matmul of bf16 operands sums their exact products in fp32", "[galore]") {
  const int64_t m = 41, n = 29, k = 173;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 15);
      const Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 16);
      const Tensor a16 = ops::convert(a, DType::bf16, host_arena());
      const Tensor b16 = ops::convert(b, DType::bf16, host_arena());
      // The bf16 values themselves: the upper half of an fp32's bits.
      const auto value = [](const Tensor& t, int64_t i) {
        const uint32_t bits = uint32_t(t.data<uint16_t>()[i]) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof f);
        return double(f);
      };
      Tensor c = random_tensor({m, n}, 17);
      const Tensor c0 = c.clone();
      ops::matmul(c, a16, ta, b16, tb, 0.5f, 0.25f);
      double rounding = 0;  // how far the fp32 operands' product is: bf16 rounding happened
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0, sum32 = 0;
          for (int64_t p = 0; p < k; ++p) {
            const int64_t ia = ta ? p * m + i : i * k + p, ib = tb ? j * k + p : p * n + j;
            sum += value(a16, ia) * value(b16, ib);
            sum32 += double(a.data<float>()[ia]) * double(b.data<float>()[ib]);
          }
          const double expected = 0.5 * sum + 0.25 * c0.data<float>()[i * n + j];
          CHECK(std::abs(c.data<float>()[i * n + j] - expected) < 1e-5);
          rounding = std::max(rounding, std::abs(0.5 * (sum - sum32)));
        }
      CHECK(rounding > 1e-3);
    }
  Tensor c = Tensor::zeros({3, 3});
  const Tensor a = random_tensor({3, 3}, 18);
  CHECK_THROWS_AS(ops::matmul(c, a, false, ops::convert(a, DType::bf16, host_arena()), false),
                  frugal::Error);
}

TEST_CASE("GaloreAdamW equals galore-torch's GaLoreAdamW over three refresh periods", "[galore]") {
  const SafetensorsFile fixture((kFixtures / "galore.safetensors").string());
  const auto& meta = fixture.metadata();
  const auto names = nlohmann::json::parse(meta.at("names")).get<std::vector<std::string>>();
  const int64_t steps = std::stoll(meta.at("steps"));
  const double lr = std::stod(meta.at("lr"));
  AdamWConfig adamw;
  adamw.beta1 = std::stod(meta.at("beta1"));
  adamw.beta2 = std::stod(meta.at("beta2"));
  adamw.eps = std::stod(meta.at("eps"));
  adamw.weight_decay = std::stod(meta.at("weight_decay"));
  adamw.grad_clip = 0;  // the reference clips nothing
  GaloreConfig galore;
  galore.projector.kind = GaloreProjectorKind::svd;
  galore.projector.rank = std::stoll(meta.at("rank"));
  galore.update_proj_gap = std::stoll(meta.at("update_proj_gap"));
  galore.scale = std::stod(meta.at("scale"));
  galore.moments_on_refresh = MomentsOnRefresh::keep;
  galore.stagger = false;

  // fp32 is the reference's arithmetic. bf16 operands round G, the projector and the step N to
  // 8 significant bits (relative 2^-9 each): each step's update is off by about 2^-8 of itself,
  // so the weights stay within 1 % of how far they moved; except where Adam's first steps, which
  // are nearly sign(R), meet a coordinate of R so near zero that rounding flips it: that one
  // step moves the other way (seen on one matrix here, 17 % of its movement).
  const auto precision = GENERATE(GaloreProjectionPrecision::fp32, GaloreProjectionPrecision::bf16);
  galore.precision = precision;
  const bool bf16 = precision == GaloreProjectionPrecision::bf16;

  std::vector<TrainableShard> shards;
  for (const std::string& name : names)
    shards.push_back(whole_shard(name, fixture.read(name + "/weight0")));
  GaloreAdamW optimizer(shards, adamw, galore);
  REQUIRE(optimizer.projected_matrices() == names.size());
  int checked = 0, within_one_percent = 0;
  for (int64_t step = 1; step <= steps; ++step) {
    for (TrainableShard& s : shards)
      s.grad.copy_from(fixture.read(s.name + "/grad/" + std::to_string(step)));
    optimizer.step(lr, step, local_collectives());
    for (const TrainableShard& s : shards) {
      const std::string saved = s.name + "/weight/" + std::to_string(step);
      if (!fixture.has(saved)) continue;
      const Tensor expected = fixture.read(saved);
      const Tensor initial = fixture.read(s.name + "/weight0");
      // What the optimizer moved the weights by, and how far from the reference it landed.
      const double moved = max_abs_difference(expected, initial);
      const double error = max_abs_difference(s.param, expected);
      INFO(enum_name(precision) << " " << s.name << " " << shape_string(s.param.shape())
                                << " after step " << step << ": moved " << moved << ", off by "
                                << error);
      CHECK(moved > 1e-2);
      if (bf16) {
        CHECK(error < 0.25 * moved);
        if (error < 0.01 * moved) ++within_one_percent;
        CHECK(error > 2e-6);  // the operands were rounded
      } else {
        CHECK(error < 2e-6);
      }
      ++checked;
    }
  }
  CHECK(checked == 3 * int(names.size()));
  if (bf16) CHECK(within_one_percent >= checked / 2);
}

TEST_CASE("a rank above a matrix's smaller side is that side (galore-torch's SVD slice)",
          "[galore]") {
  // galore-torch slices torch.linalg.svd's min(m, n) singular vectors by [:rank]: a larger rank
  // takes them all. Both sides, against the same run with the rank set to the side.
  for (const Shape& shape : {Shape{23, 9}, Shape{7, 31}}) {
    const int64_t side = std::min(shape[0], shape[1]);
    std::vector<Tensor> weights;
    for (int64_t rank : {int64_t{1000}, side}) {
      GaloreConfig galore;
      galore.projector.kind = GaloreProjectorKind::svd;
      galore.projector.rank = rank;
      galore.update_proj_gap = 2;
      std::vector<TrainableShard> shards = {
          whole_shard("model.layers.0.mlp.up_proj.weight", random_tensor(shape, 3))};
      GaloreAdamW optimizer(shards, AdamWConfig{}, galore);
      for (int64_t step = 1; step <= 5; ++step) {
        shards[0].grad.copy_from(random_tensor(shape, 10 + uint64_t(step)));
        optimizer.step(1e-2, step, local_collectives());
      }
      weights.push_back(shards[0].param);
    }
    INFO(shape_string(shape));
    CHECK(max_abs_difference(weights[0], weights[1]) == 0.0);
    CHECK(max_abs_difference(weights[0], random_tensor(shape, 3)) > 1e-3);
  }
}

TEST_CASE("the randomized projector spans the exact one's subspace", "[galore]") {
  Arena scratch("test scratch", Device::cpu);
  for (const Shape& shape : {Shape{61, 27}, Shape{19, 44}}) {
    const Tensor g = low_rank_plus_noise(shape[0], shape[1], 41, 1e-3);
    const int64_t r = 6;
    const bool right = galore_side(shape) == GaloreSide::right;
    const Shape projector_shape = right ? Shape{r, shape[1]} : Shape{shape[0], r};
    GaloreProjectorSettings exact;
    exact.kind = GaloreProjectorKind::svd;
    exact.rank = r;
    GaloreProjectorSettings randomized = exact;
    randomized.kind = GaloreProjectorKind::randomized;
    Tensor p_exact = Tensor::empty(projector_shape), p_random = Tensor::empty(projector_shape);
    galore_projector(p_exact, g, shape, exact, 0, local_collectives(), scratch);
    galore_projector(p_random, g, shape, randomized, 7, local_collectives(), scratch);
    // Orthonormal rows (right) or columns (left), compared as rows.
    auto as_rows = [&](const Tensor& p) {
      if (right) return p;
      Tensor t = Tensor::empty({r, shape[0]});
      for (int64_t i = 0; i < shape[0]; ++i)
        for (int64_t j = 0; j < r; ++j)
          t.data<float>()[j * shape[0] + i] = p.data<float>()[i * r + j];
      return t;
    };
    const Tensor a = as_rows(p_exact), b = as_rows(p_random);
    for (const Tensor& q : {a, b})
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < r; ++j) {
          double dot = 0;
          for (int64_t k = 0; k < q.size(1); ++k)
            dot += double(q.data<float>()[i * q.size(1) + k]) * q.data<float>()[j * q.size(1) + k];
          CHECK(std::abs(dot - (i == j ? 1.0 : 0.0)) < 1e-5);
        }
    const std::vector<double> cosines = principal_cosines(a, b);
    INFO(shape_string(shape) << ": smallest cosine " << cosines.back());
    CHECK(cosines.back() > 0.999);
  }
}

TEST_CASE("staggered refreshes: a few matrices per step, each once per gap", "[galore]") {
  std::vector<TrainableShard> shards;
  for (int layer = 0; layer < 3; ++layer)
    for (const char* proj : {"self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj"})
      shards.push_back(whole_shard("model.layers." + std::to_string(layer) + "." + proj + ".weight",
                                   random_tensor({8, 6}, 1)));
  shards.push_back(whole_shard("model.layers.0.input_layernorm.weight", random_tensor({6}, 2)));
  GaloreConfig galore;
  galore.projector.rank = 2;
  galore.update_proj_gap = 4;
  GaloreAdamW staggered(shards, AdamWConfig{}, galore);
  galore.stagger = false;
  GaloreAdamW together(shards, AdamWConfig{}, galore);
  REQUIRE(staggered.projected_matrices() == 9);
  for (int64_t t = 1; t < 40; ++t) {
    int due = 0, due_together = 0;
    for (size_t j = 0; j < 9; ++j) {
      due += staggered.refresh_due(j, t);
      due_together += together.refresh_due(j, t);
      // Once in every window of gap steps, and the last refresh is the latest due step.
      int in_window = 0;
      for (int64_t s = t; s > t - 4; --s) in_window += staggered.refresh_due(j, s);
      if (t >= 4) CHECK(in_window == 1);
      int64_t last = t;
      while (last > 0 && !staggered.refresh_due(j, last)) --last;
      CHECK(staggered.last_refresh(j, t) == last);
    }
    CHECK(due <= 3);  // 9 matrices over a gap of 4
    CHECK(due_together == (t % 4 == 0 ? 9 : 0));
  }
}

TEST_CASE("GaLore's state: projected moments and projectors by name, sharded or replicated",
          "[galore]") {
  // A right-side matrix [10, 4] and a left-side one [3, 9], as a rank holding rows [2, 4) of
  // each in a buffer of 3 rows sees them, and a norm weight.
  auto shard = [](const std::string& name, const Shape& full) {
    TrainableShard s;
    s.name = name;
    Shape buffer = full;
    buffer[0] = 3;
    s.param = Tensor::zeros(buffer);
    s.grad = Tensor::zeros(buffer);
    s.rows = {full, 2, std::min<int64_t>(full[0], 4)};
    return s;
  };
  GaloreConfig galore;
  galore.projector.rank = 2;
  GaloreAdamW optimizer(
      {shard("model.layers.0.mlp.up_proj.weight", {10, 4}),
       shard("model.layers.0.mlp.down_proj.weight", {3, 9}), shard("model.norm.weight", {7})},
      AdamWConfig{}, galore);
  const std::vector<StateTensor> state = optimizer.state_tensors();
  REQUIRE(state.size() == 8);
  auto find = [&](const std::string& name) {
    for (const StateTensor& s : state)
      if (s.name == name) return s;
    FAIL("no state tensor " << name);
    return StateTensor{};
  };
  const StateTensor up_m = find("optim/galore/exp_avg/model.layers.0.mlp.up_proj.weight");
  CHECK(up_m.tensor.shape() == Shape{3, 2});
  CHECK(up_m.rows.full_shape == Shape{10, 2});
  CHECK((up_m.rows.first_row == 2 && up_m.rows.last_row == 4 && !up_m.rows.replicated));
  const StateTensor up_q = find("optim/galore/projector/model.layers.0.mlp.up_proj.weight");
  CHECK(up_q.tensor.shape() == Shape{2, 4});
  CHECK(up_q.rows.replicated);
  const StateTensor down_v = find("optim/galore/exp_avg_sq/model.layers.0.mlp.down_proj.weight");
  CHECK(down_v.tensor.shape() == Shape{2, 9});
  CHECK(down_v.rows.replicated);
  const StateTensor down_p = find("optim/galore/projector/model.layers.0.mlp.down_proj.weight");
  CHECK(down_p.tensor.shape() == Shape{3, 2});
  CHECK(down_p.rows.full_shape == Shape{3, 2});
  CHECK((down_p.rows.first_row == 2 && down_p.rows.last_row == 3));
  CHECK(find("optim/exp_avg/model.norm.weight").tensor.shape() == Shape{3});
  // AdamW would hold two moments of every shard: 2 x (12 + 27 + 3) floats.
  CHECK(optimizer.state_bytes().adamw_equivalent == 2 * (12 + 27 + 3) * 4);
  CHECK(optimizer.state_bytes().total() == (12 + 8 + 36 + 6 + 6) * 4);
}

namespace {

// A corpus with structure to learn: token i + 1 follows token i by a fixed random map, three
// times in four, else a random token.
Batch markov_batch(uint64_t seed, int64_t batch, int64_t seq, int64_t vocab) {
  Batch b;
  b.batch = batch;
  b.seq = seq;
  b.tokens = Tensor::empty({batch * seq}, DType::i32);
  b.targets = Tensor::empty({batch * seq}, DType::i32);
  uint64_t state = seed;
  auto next = [&](int32_t token) {
    if (uniform01(state) < 0.25) return int32_t(splitmix64(state) % uint64_t(vocab));
    return int32_t((uint64_t(token) * 2654435761ull + 17) % uint64_t(vocab));
  };
  for (int64_t s = 0; s < batch; ++s) {
    int32_t token = int32_t(splitmix64(state) % uint64_t(vocab));
    for (int64_t i = 0; i < seq; ++i) {
      b.tokens.data<int32_t>()[s * seq + i] = token;
      token = next(token);
      b.targets.data<int32_t>()[s * seq + i] = token;
    }
  }
  b.positions = sequence_positions(batch, seq);
  return b;
}

}  // namespace

TEST_CASE("randomized against exact projectors on the tiny model's gradients", "[galore][angles]") {
  // configs/tiny.cfg's shape, trained 20 AdamW steps on a structured corpus, then one batch's
  // gradients: for every block matrix, the randomized subspace (rank 32, oversampling 8, q power
  // iterations) against the exact one, as the cosines of the principal angles and the share of
  // the gradient's energy in the exact top-32 subspace that it captures.
  LlamaConfig config;
  config.hidden_size = 192;
  config.intermediate_size = 512;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 6;
  config.num_key_value_heads = 2;
  config.vocab_size = 512;
  config.max_position_embeddings = 256;
  LlamaModel model(config);
  LocalParameters params(config, 1234, 0.02f, true);
  AdamW adamw(params.trainable(), AdamWConfig{0.9, 0.95, 1e-8, 0.1, 1.0});
  const int64_t batch = 4, seq = 128;
  for (int64_t step = 1; step <= 20; ++step) {
    params.zero_grads();
    model.forward_backward(markov_batch(uint64_t(step), batch, seq, 512), params,
                           1.0f / float(batch * seq), CheckpointPolicy::none);
    adamw.step(3e-3, step, local_collectives());
  }
  params.zero_grads();
  model.forward_backward(markov_batch(1000, batch, seq, 512), params, 1.0f / float(batch * seq),
                         CheckpointPolicy::none);

  Arena scratch("test scratch", Device::cpu);
  const int64_t r = 32;
  std::printf(
      "GaLore rank %lld on the tiny model's gradients after 20 steps: randomized "
      "(oversampling 8) against exact\n%-10s %-10s %3s %9s %9s %13s\n",
      (long long)r, "matrix", "shape", "q", "min cos", "mean cos", "energy missed");
  double mean_energy[3] = {0, 0, 0};
  int matrices = 0;
  for (const TrainableShard& s : params.trainable()) {
    if (!galore_projects(s.name, s.rows.full_shape)) continue;
    const Shape shape = s.rows.full_shape;
    const bool right = galore_side(shape) == GaloreSide::right;
    // As rows [r, side]: Q, or P^T.
    auto as_rows = [&](const Tensor& p) {
      if (right) return p;
      Tensor t = Tensor::empty({r, shape[0]});
      for (int64_t i = 0; i < shape[0]; ++i)
        for (int64_t j = 0; j < r; ++j)
          t.data<float>()[j * shape[0] + i] = p.data<float>()[i * r + j];
      return t;
    };
    // The energy of G in a subspace: ||G Q^T||^2 or ||P^T G||^2, in float64.
    auto energy = [&](const Tensor& rows) {
      const int64_t m = shape[0], n = shape[1];
      double total = 0;
      for (int64_t k = 0; k < r; ++k) {
        if (right) {
          for (int64_t i = 0; i < m; ++i) {
            double dot = 0;
            for (int64_t j = 0; j < n; ++j)
              dot += double(s.grad.data<float>()[i * n + j]) * rows.data<float>()[k * n + j];
            total += dot * dot;
          }
        } else {
          for (int64_t j = 0; j < n; ++j) {
            double dot = 0;
            for (int64_t i = 0; i < m; ++i)
              dot += double(rows.data<float>()[k * m + i]) * s.grad.data<float>()[i * n + j];
            total += dot * dot;
          }
        }
      }
      return total;
    };
    const Shape projector_shape = right ? Shape{r, shape[1]} : Shape{shape[0], r};
    GaloreProjectorSettings settings;
    settings.kind = GaloreProjectorKind::svd;
    settings.rank = r;
    Tensor exact = Tensor::empty(projector_shape);
    galore_projector(exact, s.grad, shape, settings, 0, local_collectives(), scratch);
    const Tensor exact_rows = as_rows(exact);
    const double best = energy(exact_rows);
    const std::string kind =
        s.name.substr(s.name.rfind('.', s.name.size() - 8) + 1,
                      s.name.size() - 7 - s.name.rfind('.', s.name.size() - 8) - 1);
    for (int q = 0; q <= 2; ++q) {
      settings.kind = GaloreProjectorKind::randomized;
      settings.oversampling = 8;
      settings.power_iterations = q;
      Tensor randomized = Tensor::empty(projector_shape);
      galore_projector(randomized, s.grad, shape, settings, 5, local_collectives(), scratch);
      const std::vector<double> cosines = principal_cosines(exact_rows, as_rows(randomized));
      double mean = 0;
      for (double c : cosines) mean += c / double(cosines.size());
      const double captured = energy(as_rows(randomized)) / best;
      mean_energy[q] += captured;
      if (s.name.find("layers.1.") != std::string::npos)
        std::printf("%-10s %-10s %3d %9.4f %9.4f %13.2e\n", kind.c_str(),
                    shape_string(shape).c_str(), q, cosines.back(), mean, 1.0 - captured);
      CHECK(captured <= 1.0 + 1e-5);  // nothing beats the exact top-r subspace
    }
    ++matrices;
  }
  REQUIRE(matrices == 28);
  for (double& e : mean_energy) e /= matrices;
  std::printf("mean over the %d matrices of the energy missed: q=0 %.2e, q=1 %.2e, q=2 %.2e\n",
              matrices, 1.0 - mean_energy[0], 1.0 - mean_energy[1], 1.0 - mean_energy[2]);
  CHECK(mean_energy[1] > 0.9);
  CHECK(mean_energy[2] >= mean_energy[0]);
}
