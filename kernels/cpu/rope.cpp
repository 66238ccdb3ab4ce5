// Rotary position embedding in Hugging Face's rotate-half convention, and its backward (the
// inverse rotation).
#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace frugal::cpu {

namespace {

// Rotates x in place by sign * angle(positions[t], i) for every token, head and pair i, and
// scales by `scaling`. The angles follow Hugging Face's LlamaRotaryEmbedding: inv_freq_i is a
// float, angle = float(pos) * inv_freq_i is a float product, cos/sin of that float angle are
// taken in double and rounded, then multiplied by the attention scaling in float. So a
// checkpoint trained here sees the same rotation (to an ulp) as the model in transformers.
void rotate(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
            const float* inv_freq, float scaling, float sign) {
  FRUGAL_CHECK(head_dim % 2 == 0, "rope needs an even head_dim, got ", head_dim);
  const int64_t half = head_dim / 2;

#pragma omp parallel if (tokens * heads * head_dim >= (1 << 14))
  {
    std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos_t[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * scaling;
        sin_t[i] = sign * (static_cast<float>(std::sin(static_cast<double>(angle))) * scaling);
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
                  int64_t head_dim, const float* inv_freq, float attention_scaling) {
  rotate(x, positions, tokens, heads, head_dim, inv_freq, attention_scaling, 1.0f);
}

void rope_backward(float* dx, const int32_t* positions, int64_t tokens, int64_t heads,
                   int64_t head_dim, const float* inv_freq, float attention_scaling) {
  rotate(dx, positions, tokens, heads, head_dim, inv_freq, attention_scaling, -1.0f);
}

}  // namespace frugal::cpu
