// Rotary position embedding in Hugging Face's rotate-half convention, and its backward (the
// inverse rotation).
#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace frugal::cpu {

namespace {

// Rotates x in place by sign * angle(positions[t], i) for every token, head and pair i.
// The angles follow Hugging Face's LlamaRotaryEmbedding: inv_freq_i = 1 / theta^(2i/d) is a
// float (computed here in double and rounded once), angle = float(pos) * inv_freq_i is a float
// product, and cos/sin of that float angle are taken in double and rounded. So a checkpoint
// trained here sees the same rotation (to an ulp) as the model in transformers.
void rotate(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
            float theta, float sign) {
  FRUGAL_CHECK(head_dim % 2 == 0, "rope needs an even head_dim, got ", head_dim);
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const double exponent = static_cast<double>(2 * i) / static_cast<double>(head_dim);
    inv_freq[i] = static_cast<float>(1.0 / std::pow(static_cast<double>(theta), exponent));
  }

#pragma omp parallel if (tokens * heads * head_dim >= (1 << 14))
  {
    std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos_t[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin_t[i] = sign * static_cast<float>(std::sin(static_cast<double>(angle)));
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* xh = x + (t * heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = xh[i], x2 = xh[i + half];
          xh[i] = x1 * cos_t[i] - x2 * sin_t[i];
          xh[i + half] = x2 * cos_t[i] + x1 * sin_t[i];
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                  int64_t head_dim, float theta) {
  rotate(x, positions, tokens, heads, head_dim, theta, 1.0f);
}

void rope_backward(float* dx, const int32_t* positions, int64_t tokens, int64_t heads,
                   int64_t head_dim, float theta) {
  rotate(dx, positions, tokens, heads, head_dim, theta, -1.0f);
}

}  // namespace frugal::cpu
