// 8-bit AdamW (optim.state_dtype = int8): the code maps are bitsandbytes'; the CPU twin equals,
// bit for bit, an independent float32 NumPy implementation of bitsandbytes' block-wise
// algorithm over 100 steps (tests/fixtures/adamw8bit/reference, tools/make_adamw8bit_fixtures.py),
// with blocks of 64, 256 and 2048 and gradients with outliers; and bitsandbytes' own AdamW8bit
// where its fixtures were made (bnb_cuda: on a GPU machine, read when present). Codes are the
// nearest; blocks stay within rows; a bf16 master rounds the f32 result once; the optimizer keeps
// 32-bit moments for vectors and small matrices, names its 8-bit state in checkpoints and
// reloads it exactly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/adamw_int8.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/quantized_moments.h"
#include "test_support.h"

using namespace frugal;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(FRUGAL_SOURCE_DIR) / "tests" / "fixtures" / "adamw8bit";
constexpr int kSteps = 100;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The fixtures' values (make_adamw8bit_fixtures.py's uniform): 24 bits of SplitMix64 of
// seed * C1 + stream * C2 + i, as a float in [-1, 1), exact.
std::vector<float> uniform(uint64_t seed, uint64_t stream, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = seed * 0xD1B54A32D192ED03ull + stream * 0x9E3779B97F4A7C15ull + uint64_t(i);
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[size_t(i)] = float(double(z >> 40) / double(1 << 23) - 1.0);
  }
  return out;
}
std::vector<float> initial_weight(int64_t n) {
  std::vector<float> w = uniform(7, 0, n);
  for (float& x : w) x *= 0.1f;
  return w;
}
std::vector<float> gradient(int64_t step, int64_t n, bool outliers) {
  std::vector<float> g = uniform(11, uint64_t(step), n);
  for (float& x : g) x *= 0.01f;
  if (outliers)
    for (int64_t i = 0; i < n; i += 509) g[size_t(i)] *= 1000.0f;
  return g;
}

struct Final {
  std::vector<uint8_t> m_codes, v_codes;
  std::vector<float> m_absmax, v_absmax, weight;
};

Final read_case(const fs::path& dir, const nlohmann::json& c) {
  const int64_t n = c["rows"].get<int64_t>() * c["cols"].get<int64_t>();
  const int64_t cols = c["cols"], block = c["block"];
  const int64_t blocks = c["rows"].get<int64_t>() * ((cols + block - 1) / block);
  const std::string bytes = read_all(dir / (c["name"].get<std::string>() + ".bin"));
  REQUIRE(bytes.size() == size_t(2 * n + 8 * blocks + 4 * n));
  Final f;
  const char* p = bytes.data();
  f.m_codes.assign(p, p + n);
  f.v_codes.assign(p + n, p + 2 * n);
  f.m_absmax.resize(size_t(blocks));
  f.v_absmax.resize(size_t(blocks));
  f.weight.resize(size_t(n));
  std::memcpy(f.m_absmax.data(), p + 2 * n, size_t(4 * blocks));
  std::memcpy(f.v_absmax.data(), p + 2 * n + 4 * blocks, size_t(4 * blocks));
  std::memcpy(f.weight.data(), p + 2 * n + 8 * blocks, size_t(4 * n));
  return f;
}

// frugal's CPU twin on a fixture case: 100 steps from the same weight and gradients.
Final run_case(const nlohmann::json& c) {
  const cpu::Int8Layout layout{c["rows"], c["cols"], c["block"]};
  const int64_t n = layout.rows * layout.cols, blocks = layout.rows * layout.blocks_per_row();
  Final f;
  f.weight = initial_weight(n);
  f.m_codes.assign(size_t(n), 0);
  f.v_codes.assign(size_t(n), 0);
  f.m_absmax.assign(size_t(blocks), 0.0f);
  f.v_absmax.assign(size_t(blocks), 0.0f);
  for (int64_t t = 1; t <= kSteps; ++t) {
    const std::vector<float> g = gradient(t, n, c["outliers"]);
    cpu::AdamWStep s;
    s.lr = c["lr"].get<float>();
    s.beta1 = c["beta1"].get<float>();
    s.beta2 = c["beta2"].get<float>();
    s.eps = c["eps"].get<float>();
    s.weight_decay = c["weight_decay"].get<float>();
    s.step = t;
    cpu::adamw_int8_update(f.weight.data(), g.data(), {f.m_codes.data(), f.m_absmax.data()},
                           {f.v_codes.data(), f.v_absmax.data()}, layout, s);
  }
  return f;
}

template <class T>
int64_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return d;
}

}  // namespace

TEST_CASE("8-bit AdamW: the code maps are bitsandbytes' dynamic maps", "[adamw8bit]") {
  const std::string bytes = read_all(kFixtures / "reference" / "code_maps.bin");
  REQUIRE(bytes.size() == 2 * 256 * sizeof(float));
  for (int k = 0; k < 2; ++k) {
    const std::array<float, 256> mine = cpu::dynamic_code_map(k == 0);
    std::array<float, 256> theirs;
    std::memcpy(theirs.data(), bytes.data() + k * 256 * sizeof(float), sizeof theirs);
    for (int i = 0; i < 256; ++i) {
      INFO((k == 0 ? "signed" : "unsigned") << " code " << i);
      CHECK(std::memcmp(&mine[size_t(i)], &theirs[size_t(i)], sizeof(float)) == 0);
    }
  }
}

TEST_CASE("8-bit AdamW: the CPU twin equals the NumPy implementation bit for bit", "[adamw8bit]") {
  const fs::path dir = kFixtures / "reference";
  const nlohmann::json meta = nlohmann::json::parse(read_all(dir / "cases.json"));
  REQUIRE(meta["steps"] == kSteps);
  REQUIRE(meta["cases"].size() >= 5);
  for (const nlohmann::json& c : meta["cases"]) {
    INFO(c.dump());
    const Final expected = read_case(dir, c), got = run_case(c);
    CHECK(differing(got.m_codes, expected.m_codes) == 0);
    CHECK(differing(got.v_codes, expected.v_codes) == 0);
    CHECK(differing(got.m_absmax, expected.m_absmax) == 0);
    CHECK(differing(got.v_absmax, expected.v_absmax) == 0);
    CHECK(differing(got.weight, expected.weight) == 0);
    // The weights moved, and the moments use many codes (not a degenerate run).
    const std::vector<float> w0 = initial_weight(int64_t(got.weight.size()));
    double moved = 0;
    for (size_t i = 0; i < w0.size(); ++i)
      moved = std::max(moved, double(std::fabs(got.weight[i] - w0[i])));
    CHECK(moved > 0.02);
    std::vector<uint8_t> used = got.m_codes;
    std::sort(used.begin(), used.end());
    CHECK(std::unique(used.begin(), used.end()) - used.begin() > 40);
  }
}

// bitsandbytes' AdamW8bit itself, where its fixtures were made (on a GPU machine:
// tools/make_adamw8bit_fixtures.py --source bnb --device cuda). The state bytes must be equal;
// the weights within a bound derived from the differences in arithmetic (kernels/blockwise_int8.h:
// bitsandbytes' __fdividef and __powf err by up to 2 ulp, nvcc contracts its moment updates
// into fused multiply-adds): per step an update differs by at most 8 ulp of its size (at most
// lr * max|s1 / (sqrt(s2) + eps')|, bounded here by the weights' own movement) and a weight by
// 1 ulp of its rounding, so after T steps |w - w_bnb| <= T (8 ulp(update) + ulp(|w|)).
TEST_CASE("8-bit AdamW: bitsandbytes' AdamW8bit fixtures, where present", "[adamw8bit]") {
  const fs::path dir = kFixtures / "bnb_cuda";
  if (!fs::exists(dir / "cases.json")) {
    WARN("no " << dir.string()
               << ": bitsandbytes' CUDA AdamW8bit fixtures are made on a GPU machine "
                  "(tools/make_adamw8bit_fixtures.py --source bnb --device cuda)");
    return;
  }
  const nlohmann::json meta = nlohmann::json::parse(read_all(dir / "cases.json"));
  REQUIRE(meta["steps"] == kSteps);
  const std::string maps = read_all(dir / "code_maps.bin");
  for (int k = 0; k < 2; ++k) {
    const std::array<float, 256> mine = cpu::dynamic_code_map(k == 0);
    CHECK(std::memcmp(mine.data(), maps.data() + k * 1024, 1024) == 0);
  }
  for (const nlohmann::json& c : meta["cases"]) {
    INFO(c.dump());
    const Final expected = read_case(dir, c), got = run_case(c);
    CHECK(differing(got.m_codes, expected.m_codes) == 0);
    CHECK(differing(got.v_codes, expected.v_codes) == 0);
    CHECK(differing(got.m_absmax, expected.m_absmax) == 0);
    CHECK(differing(got.v_absmax, expected.v_absmax) == 0);
    const std::vector<float> w0 = initial_weight(int64_t(got.weight.size()));
    const double ulp = std::ldexp(1.0, -23);
    double worst_excess = 0;
    for (size_t i = 0; i < w0.size(); ++i) {
      const double step = std::fabs(got.weight[i] - w0[i]) + c["lr"].get<double>();
      const double bound = kSteps * (8 * ulp * step + ulp * std::fabs(got.weight[i]));
      worst_excess = std::max(worst_excess, std::fabs(got.weight[i] - expected.weight[i]) - bound);
    }
    CHECK(worst_excess <= 0);
  }
}

TEST_CASE("8-bit moments: every code is the nearest, blocks stay within rows", "[adamw8bit]") {
  const cpu::Int8CodeMaps& maps = cpu::int8_code_maps();
  // Rows of 300 values in blocks of 256: two blocks a row, the second of 44.
  const cpu::Int8Layout layout{5, 300, 256};
  std::vector<float> x = uniform(3, 1, 1500);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= std::pow(10.0f, -float(i % 7));  // wide range
  x[17] = 250.0f;  // an outlier in one block only
  std::vector<uint8_t> codes(1500);
  std::vector<float> absmax(10);
  for (bool is_signed : {true, false}) {
    std::vector<float> in = x;
    if (!is_signed)
      for (float& v : in) v = std::fabs(v);
    cpu::quantize_blockwise({codes.data(), absmax.data()}, in.data(), layout, is_signed);
    const float* code = maps.code[is_signed ? 0 : 1];
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t b = 0; b < 2; ++b) {
        const int64_t first = r * 300 + b * 256, count = b == 0 ? 256 : 44;
        float a = 0;
        for (int64_t i = first; i < first + count; ++i) a = std::max(a, std::fabs(in[size_t(i)]));
        CHECK(absmax[size_t(r * 2 + b)] == a);
        for (int64_t i = first; i < first + count; ++i) {
          const float v = in[size_t(i)] / a;
          // Brute force: the distance to the chosen code is the least (the sign rule may move a
          // signed value that rounds to 0 to the smallest code of its sign).
          double best = 1e30;
          for (int k = 0; k < 256; ++k) best = std::min(best, std::fabs(double(code[k]) - v));
          const double chosen = std::fabs(double(code[codes[size_t(i)]]) - v);
          if (is_signed && code[codes[size_t(i)]] != 0.0f &&
              std::signbit(code[codes[size_t(i)]]) == std::signbit(v) && chosen > best)
            CHECK(chosen <= std::fabs(double(code[codes[size_t(i)]])));  // moved off zero
          else
            CHECK(chosen <= best);
          if (is_signed && v != 0.0f)
            CHECK(std::signbit(code[codes[size_t(i)]]) == std::signbit(v));
        }
      }
    std::vector<float> back(1500);
    cpu::dequantize_blockwise(back.data(), {codes.data(), absmax.data()}, layout, is_signed);
    for (size_t i = 0; i < back.size(); ++i)
      CHECK(back[i] == code[codes[i]] * absmax[(i / 300) * 2 + (i % 300) / 256]);
  }
}

TEST_CASE("8-bit AdamW: a bf16 master is the f32 update rounded to nearest once", "[adamw8bit]") {
  const cpu::Int8Layout layout{4, 256, 256};
  const int64_t n = 1024;
  std::vector<uint16_t> w16(n), g16(n);
  const std::vector<float> w0 = initial_weight(n);
  for (int64_t i = 0; i < n; ++i) w16[size_t(i)] = float_to_bf16(w0[size_t(i)]);
  std::vector<float> w32(n);
  for (int64_t i = 0; i < n; ++i) w32[size_t(i)] = bf16_to_float(w16[size_t(i)]);
  std::vector<uint8_t> m16(n), v16(n), m32(n), v32(n);
  std::vector<float> am16(4), av16(4), am32(4), av32(4);
  for (int64_t t = 1; t <= 5; ++t) {
    const std::vector<float> g = gradient(t, n, true);
    std::vector<float> g32(n);
    for (int64_t i = 0; i < n; ++i) {
      g16[size_t(i)] = float_to_bf16(g[size_t(i)]);
      g32[size_t(i)] = bf16_to_float(g16[size_t(i)]);
    }
    cpu::AdamWStep s;
    s.lr = 1e-3f;
    s.weight_decay = 0.1f;
    s.step = t;
    cpu::adamw_int8_update(w16.data(), g16.data(), {m16.data(), am16.data()},
                           {v16.data(), av16.data()}, layout, s, Bf16Store());
    cpu::adamw_int8_update(w32.data(), g32.data(), {m32.data(), am32.data()},
                           {v32.data(), av32.data()}, layout, s);
    // The f32 twin starts each step from the bf16 weights.
    for (int64_t i = 0; i < n; ++i) {
      CHECK(w16[size_t(i)] == float_to_bf16(w32[size_t(i)]));
      w32[size_t(i)] = bf16_to_float(w16[size_t(i)]);
    }
    CHECK(m16 == m32);
    CHECK(v16 == v32);
  }
}

TEST_CASE("8-bit AdamW optimizer: which tensors, their checkpoint names, exact reload",
          "[adamw8bit]") {
  // A matrix of 4096 values (8-bit), a smaller one and a vector (32-bit moments).
  std::vector<TrainableShard> shards;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{
           {"model.layers.0.mlp.up_proj.weight", {16, 256}},
           {"model.layers.0.self_attn.q_proj.weight", {8, 64}},
           {"model.layers.0.input_layernorm.weight", {4096}}}) {
    TrainableShard s;
    s.name = name;
    s.param = Tensor::empty(shape);
    s.grad = Tensor::empty(shape);
    const std::vector<float> w = initial_weight(s.param.numel());
    std::copy(w.begin(), w.end(), s.param.data<float>());
    s.rows = whole_rows(shape, false);
    shards.push_back(s);
  }
  AdamWConfig config;
  config.int8_state = true;
  config.weight_decay = 0.1;
  config.grad_clip = 0;  // (the twin below is not clipped)
  AdamW optimizer(shards, config);
  std::vector<std::string> names;
  for (const StateTensor& t : optimizer.state_tensors()) names.push_back(t.name);
  CHECK(names ==
        std::vector<std::string>{"optim/exp_avg/model.layers.0.mlp.up_proj.weight.codes",
                                 "optim/exp_avg/model.layers.0.mlp.up_proj.weight.absmax",
                                 "optim/exp_avg_sq/model.layers.0.mlp.up_proj.weight.codes",
                                 "optim/exp_avg_sq/model.layers.0.mlp.up_proj.weight.absmax",
                                 "optim/exp_avg/model.layers.0.self_attn.q_proj.weight",
                                 "optim/exp_avg_sq/model.layers.0.self_attn.q_proj.weight",
                                 "optim/exp_avg/model.layers.0.input_layernorm.weight",
                                 "optim/exp_avg_sq/model.layers.0.input_layernorm.weight"});
  const std::vector<StateTensor> state = optimizer.state_tensors();
  CHECK(state[0].tensor.dtype() == DType::u8);
  CHECK(state[1].rows.full_shape == Shape{16, 1});
  CHECK(state[4].tensor.dtype() == DType::f32);

  // The 8-bit matrix follows the CPU twin exactly.
  const cpu::Int8Layout layout{16, 256, 256};
  std::vector<float> w = initial_weight(4096);
  std::vector<uint8_t> mc(4096), vc(4096);
  std::vector<float> ma(16), va(16);
  const auto run = [&](AdamW& opt, int64_t first, int64_t last) {
    for (int64_t t = first; t <= last; ++t) {
      for (TrainableShard& s : shards) {
        const std::vector<float> g = gradient(t, s.grad.numel(), true);
        std::copy(g.begin(), g.end(), s.grad.data<float>());
      }
      opt.step(1e-3, t, local_collectives());
    }
  };
  run(optimizer, 1, 3);
  for (int64_t t = 1; t <= 3; ++t) {
    const std::vector<float> g = gradient(t, 4096, true);
    cpu::AdamWStep s;
    s.lr = 1e-3f;
    s.beta1 = 0.9f;
    s.beta2 = 0.95f;
    s.eps = 1e-8f;
    s.weight_decay = 0.1f;
    s.step = t;
    cpu::adamw_int8_update(w.data(), g.data(), {mc.data(), ma.data()}, {vc.data(), va.data()},
                           layout, s);
  }
  CHECK(std::memcmp(w.data(), shards[0].param.data<float>(), 4096 * 4) == 0);
  CHECK(std::memcmp(mc.data(), state[0].tensor.data<uint8_t>(), 4096) == 0);
  CHECK(std::memcmp(va.data(), state[3].tensor.data<float>(), 16 * 4) == 0);

  // The checkpoint path: codes widen to f32 and narrow back exactly; a value that is not a
  // code is refused by name.
  const Tensor saved = ops::to_host_f32(state[0].tensor);
  CHECK(saved.dtype() == DType::f32);
  Tensor reloaded = Tensor::zeros(state[0].tensor.shape(), DType::u8);
  ops::assign(reloaded, saved);
  CHECK(std::memcmp(reloaded.data<uint8_t>(), state[0].tensor.data<uint8_t>(), 4096) == 0);
  Tensor bad = saved.clone();
  bad.data<float>()[5] = 2.5f;
  CHECK(test::error_of([&] { ops::assign(reloaded, bad); }).find("not a code") !=
        std::string::npos);
}
