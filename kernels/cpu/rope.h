// Rotary position embedding in Hugging Face's rotate-half convention: for head-dim d, pair
// element i with i + d/2, angle = pos * inv_freq[i] (1 / theta^(2i/d) without scaling; the
// scaled tables of linear, dynamic, YaRN and Llama 3 come from the caller).
#pragma once
#include <cstdint>

namespace frugal::cpu {

// x: [tokens, heads, head_dim], rotated in place by the angle of positions[t]. The angle is
// rounded as transformers rounds it: angle = float(pos) * inv_freq[i] in fp32, cos/sin of
// that float angle rounded to float, then multiplied in fp32 by attention_scaling (YaRN's
// factor on cos and sin; 1 otherwise). inv_freq holds head_dim / 2 floats; head_dim even.
void rope_forward(float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                  int64_t head_dim, const float* inv_freq, float attention_scaling);
// The backward of a scaled rotation s R is s R^T: dx rotated in place by -angle, times s.
void rope_backward(float* dx, const int32_t* positions, int64_t tokens, int64_t heads,
                   int64_t head_dim, const float* inv_freq, float attention_scaling);

}  // namespace frugal::cpu
