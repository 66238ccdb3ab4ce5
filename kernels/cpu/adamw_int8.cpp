// 8-bit AdamW on the CPU: bitsandbytes' block-wise algorithm (kernels/blockwise_int8.h), one
// block of state at a time, the blocks spread over the threads.
#include "kernels/cpu/adamw_int8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace frugal::cpu {

std::array<float, kInt8Codes> dynamic_code_map(bool is_signed) {
  // 10^(i - 6) as Python computes 10 ** (i - 6), then taken as a float by torch's multiply.
  static constexpr double kPowers[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int64_t k = is_signed ? (int64_t{1} << i) + 1 : (int64_t{1} << (i + 1)) + 1;
    // torch.linspace(0.1, 1, k) in float: the first half start + step j, the second end -
    // step (k - 1 - j), each one fused multiply-add (as torch's CPU build computes them).
    const float start = 0.1f, end = 1.0f, step = (end - start) / static_cast<float>(k - 1);
    std::vector<float> points(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j)
      points[size_t(j)] = j < k / 2 ? std::fma(step, static_cast<float>(j), start)
                                    : std::fma(-step, static_cast<float>(k - 1 - j), end);
    const float scale = static_cast<float>(kPowers[i]);
    for (int64_t j = 0; j + 1 < k; ++j) {
      const float mean = (points[size_t(j)] + points[size_t(j + 1)]) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-(scale * mean));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  FRUGAL_CHECK(data.size() == size_t(kInt8Codes), "dynamic code map of ", data.size(), " values");
  std::sort(data.begin(), data.end());
  std::array<float, kInt8Codes> out;
  std::copy(data.begin(), data.end(), out.begin());
  return out;
}

const Int8CodeMaps& int8_code_maps() {
  static const Int8CodeMaps maps = [] {
    Int8CodeMaps m;
    for (int k = 0; k < 2; ++k) {
      const std::array<float, kInt8Codes> code = dynamic_code_map(k == 0);
      for (int i = 0; i < kInt8Codes; ++i) m.code[k][i] = code[size_t(i)];
      for (int i = 0; i + 1 < kInt8Codes; ++i)
        m.midpoint[k][i] = (code[size_t(i)] + code[size_t(i + 1)]) * 0.5f;
    }
    return m;
  }();
  return maps;
}

Int8AdamScalars int8_adam_scalars(const AdamWStep& s) {
  FRUGAL_CHECK(s.step >= 1, "adamw step is 1-based, got ", s.step);
  const double lr = s.lr, b1 = s.beta1, b2 = s.beta2;
  const double correction1 = 1.0 - std::pow(b1, static_cast<double>(s.step));
  const double correction2 = std::sqrt(1.0 - std::pow(b2, static_cast<double>(s.step)));
  Int8AdamScalars c;
  c.beta1 = s.beta1;
  c.beta2 = s.beta2;
  c.one_minus_b1 = static_cast<float>(1.0 - b1);
  c.one_minus_b2 = static_cast<float>(1.0 - b2);
  c.step_size = static_cast<float>(-lr * correction2 / correction1);
  c.eps_c2 = static_cast<float>(correction2 * static_cast<double>(s.eps));
  c.decay = static_cast<float>(1.0 - lr * static_cast<double>(s.weight_decay));
  c.decays = s.weight_decay > 0.0f;
  c.grad_scale = s.grad_scale;
  return c;
}

namespace {

void check_layout(const Int8Layout& l) {
  FRUGAL_CHECK(l.rows >= 0 && l.cols >= 0 && l.block >= 1, "8-bit state of ", l.rows, " x ", l.cols,
               " in blocks of ", l.block);
}

// Calls body(first, count, block_index) for every block of the layout, over the threads. A body
// keeps its block's values in `scratch` (one per thread).
template <class Body>
void for_each_block(const Int8Layout& l, Body body) {
  check_layout(l);
  const int64_t per_row = l.blocks_per_row(), blocks = l.rows * per_row;
#pragma omp parallel if (blocks > 8)
  {
    std::vector<float> s1(size_t(l.block)), s2(size_t(l.block));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t row = b / per_row, first_col = (b % per_row) * l.block;
      const int64_t count = std::min(l.block, l.cols - first_col);
      body(row * l.cols + first_col, count, b, s1.data(), s2.data());
    }
  }
}

// The moments of one block moved by its gradients (grad(i) gives element i's, scaled), and the
// block's new absmax, written into m and v.
template <class Grad>
void block_moments(Int8Moment m, Int8Moment v, int64_t first, int64_t count, int64_t b, float* s1,
                   float* s2, const Int8AdamScalars& c, Grad grad, float& a1, float& a2) {
  const Int8CodeMaps& maps = int8_code_maps();
  const float old1 = m.absmax[b], old2 = v.absmax[b];
  a1 = 0.0f;
  a2 = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    float x1 = int8_mul(maps.code[0][m.codes[first + i]], old1);
    float x2 = int8_mul(maps.code[1][v.codes[first + i]], old2);
    int8_moments(x1, x2, grad(first + i), c);
    s1[i] = x1;
    s2[i] = x2;
    a1 = std::max(a1, std::fabs(x1));
    a2 = std::max(a2, std::fabs(x2));
  }
}

void store_codes(Int8Moment m, Int8Moment v, int64_t first, int64_t count, int64_t b,
                 const float* s1, const float* s2, float a1, float a2) {
  const Int8CodeMaps& maps = int8_code_maps();
  for (int64_t i = 0; i < count; ++i) {
    m.codes[first + i] = int8_code_signed(maps.code[0], maps.midpoint[0], s1[i], a1);
    v.codes[first + i] = int8_code_unsigned(maps.midpoint[1], s2[i], a2);
  }
  m.absmax[b] = a1;
  v.absmax[b] = a2;
}

}  // namespace

void adamw_int8_update(float* param, const float* grad, Int8Moment m, Int8Moment v,
                       const Int8Layout& layout, const AdamWStep& s, uint16_t* param_bf16) {
  const Int8AdamScalars c = int8_adam_scalars(s);
  for_each_block(layout, [&](int64_t first, int64_t count, int64_t b, float* s1, float* s2) {
    const auto g = [&](int64_t i) { return int8_mul(grad[i], c.grad_scale); };
    float a1, a2;
    block_moments(m, v, first, count, b, s1, s2, c, g, a1, a2);
    for (int64_t i = 0; i < count; ++i) {
      const float p = int8_adam_weight(param[first + i], s1[i], s2[i], g(first + i), c);
      param[first + i] = p;
      if (param_bf16) param_bf16[first + i] = bf16_round_nearest(p);
    }
    store_codes(m, v, first, count, b, s1, s2, a1, a2);
  });
}

void adamw_int8_update(uint16_t* param, const uint16_t* grad, Int8Moment m, Int8Moment v,
                       const Int8Layout& layout, const AdamWStep& s, const Bf16Store& store) {
  const Int8AdamScalars c = int8_adam_scalars(s);
  for_each_block(layout, [&](int64_t first, int64_t count, int64_t b, float* s1, float* s2) {
    const auto g = [&](int64_t i) { return int8_mul(int8_load_bf16(grad[i]), c.grad_scale); };
    float a1, a2;
    block_moments(m, v, first, count, b, s1, s2, c, g, a1, a2);
    for (int64_t i = 0; i < count; ++i)
      param[first + i] = bf16_store(
          int8_adam_weight(int8_load_bf16(param[first + i]), s1[i], s2[i], g(first + i), c), store,
          first + i);
    store_codes(m, v, first, count, b, s1, s2, a1, a2);
  });
}

void galore_moments_int8(Int8Moment m, Int8Moment v, float* r, const Int8Layout& layout,
                         float beta1, float beta2, float eps) {
  AdamWStep s;
  s.beta1 = beta1;
  s.beta2 = beta2;
  const Int8AdamScalars c = int8_adam_scalars(s);
  for_each_block(layout, [&](int64_t first, int64_t count, int64_t b, float* s1, float* s2) {
    float a1, a2;
    block_moments(
        m, v, first, count, b, s1, s2, c, [&](int64_t i) { return r[i]; }, a1, a2);
    for (int64_t i = 0; i < count; ++i)
      r[first + i] = int8_div(s1[i], int8_add(int8_sqrt(s2[i]), eps));
    store_codes(m, v, first, count, b, s1, s2, a1, a2);
  });
}

void quantize_blockwise(Int8Moment q, const float* x, const Int8Layout& layout, bool is_signed) {
  const Int8CodeMaps& maps = int8_code_maps();
  for_each_block(layout, [&](int64_t first, int64_t count, int64_t b, float*, float*) {
    float a = 0.0f;
    for (int64_t i = 0; i < count; ++i) a = std::max(a, std::fabs(x[first + i]));
    for (int64_t i = 0; i < count; ++i)
      q.codes[first + i] = is_signed
                               ? int8_code_signed(maps.code[0], maps.midpoint[0], x[first + i], a)
                               : int8_code_unsigned(maps.midpoint[1], x[first + i], a);
    q.absmax[b] = a;
  });
}

void dequantize_blockwise(float* x, Int8Moment q, const Int8Layout& layout, bool is_signed) {
  const float* code = int8_code_maps().code[is_signed ? 0 : 1];
  for_each_block(layout, [&](int64_t first, int64_t count, int64_t b, float*, float*) {
    for (int64_t i = 0; i < count; ++i)
      x[first + i] = int8_mul(code[q.codes[first + i]], q.absmax[b]);
  });
}

}  // namespace frugal::cpu
