// The seeded initialisation and NF4's first level as the devices share them (kernels/normal_init.h,
// ops::normal_rows, ops::nf4_first_level): the rows equal a sequential SplitMix64 Box-Muller
// written here (the initialisation as it was before rows could be made on a GPU), any element
// can be redone alone (the GPU's hand-over), and the first level equals nf4_quantize's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "catch_compat.h"
#include "core/random.h"
#include "kernels/cpu/normal_init.h"
#include "model/parameter_provider.h"
#include "ops/ops.h"
#include "quant/nf4.h"

using namespace frugal;

namespace {

// Row r's values drawn one after the other from its SplitMix64 stream.
std::vector<float> sequential_rows(int64_t rows, int64_t row_len, uint64_t key, int64_t first_row,
                                   float std) {
  std::vector<float> out(size_t(rows * row_len));
  for (int64_t r = 0; r < rows; ++r) {
    uint64_t state = key ^ (0xD1B54A32D192ED03ull * uint64_t(first_row + r + 1));
    for (int64_t j = 0; j < row_len; j += 2) {
      const double u1 = (double(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;
      const double u2 = uniform01(state);
      const double radius = std::sqrt(-2.0 * std::log(u1));
      out[size_t(r * row_len + j)] = float(double(std) * radius * std::cos(2.0 * M_PI * u2));
      if (j + 1 < row_len)
        out[size_t(r * row_len + j + 1)] = float(double(std) * radius * std::sin(2.0 * M_PI * u2));
    }
  }
  return out;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("seeded rows: the sequential stream's numbers, any element alone", "[init]") {
  const uint64_t key = init_row_key("layers.3.mlp.up_proj.weight", 1234);
  for (const auto& [rows, row_len, first_row] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 0}, {3, 7, 5}, {17, 192, 40}}) {
    INFO("rows " << rows << " x " << row_len << " from row " << first_row);
    const std::vector<float> want = sequential_rows(rows, row_len, key, first_row, 0.02f);
    Tensor t = Tensor::empty({rows, row_len}, DType::f32);
    CHECK(ops::normal_rows(t, key, first_row, 0.02f) == 0);
    CHECK(same_bits(t.data<float>(), want.data(), want.size()));
    size_t alone_differs = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < row_len; ++j)
        alone_differs +=
            cpu::normal_value(key, first_row + r, j, 0.02f) != want[size_t(r * row_len + j)];
    CHECK(alone_differs == 0);
  }
}

TEST_CASE("seeded rows: init_parameter_rows draws projections from them", "[init]") {
  const std::string name = "layers.0.self_attn.q_proj.weight";
  CHECK(init_is_normal(name));
  CHECK_FALSE(init_is_normal("layers.0.input_layernorm.weight"));
  CHECK_FALSE(init_is_normal("layers.0.self_attn.q_proj.lora_A.weight"));
  Tensor rows = Tensor::empty({5, 64}, DType::f32);
  init_parameter_rows(rows, name, 9, 77, 0.03f);
  const std::vector<float> want = sequential_rows(5, 64, init_row_key(name, 77), 9, 0.03f);
  CHECK(same_bits(rows.data<float>(), want.data(), want.size()));
}

TEST_CASE("nf4 first level: the codes and absmax nf4_quantize keeps", "[init][quant]") {
  const int64_t rows = 13, row_len = 320, blocks = rows * row_len / 64;
  Tensor w = Tensor::empty({rows, row_len}, DType::f32);
  ops::normal_rows(w, 99, 0, 0.05f);
  std::fill_n(w.data<float>() + 128, 64, 0.0f);  // an all-zero block: code 7, absmax 0
  Tensor codes = Tensor::zeros({blocks * 32}, DType::u8);
  Tensor absmax = Tensor::zeros({blocks}, DType::f32);
  CHECK(ops::nf4_first_level(w, blocks, codes, absmax, nf4_midpoints().data()) == blocks);
  const Nf4Weight q = nf4_quantize(w, "w");
  CHECK(std::memcmp(codes.data<uint8_t>(), q.codes.data<uint8_t>(), size_t(blocks * 32)) == 0);
  // The absmax: each block's largest magnitude, and the second level nf4_quantize made of them.
  for (int64_t b = 0; b < blocks; ++b) {
    float amax = 0;
    for (int64_t i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(w.data<float>()[b * 64 + i]));
    CHECK(absmax.data<float>()[b] == amax);
  }
  std::vector<uint8_t> absmax_codes(static_cast<size_t>(blocks));
  std::vector<float> scales(size_t(q.absmax_scales.numel()));
  float offset = 0;
  nf4_double_quantize(absmax.data<float>(), blocks, absmax_codes.data(), scales.data(), &offset);
  CHECK(std::memcmp(absmax_codes.data(), q.absmax_codes.data<uint8_t>(), size_t(blocks)) == 0);
  CHECK(offset == q.absmax_offset);
  w.data<float>()[5 * 64 + 3] = NAN;  // block 5 reported
  CHECK(ops::nf4_first_level(w, blocks, codes, absmax, nf4_midpoints().data()) == 5);
}
