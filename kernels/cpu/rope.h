// Rotary position embedding in Hugging Face's rotate-half convention: for head-dim d, pair
// element i with i + d/2, angle = pos * theta^(-2i/d).
#pragma once
#include <cstdint>

namespace frugal::cpu {

// x: [tokens, heads, head_dim], rotated in place by the angle of positions[t]. The angle is
// rounded as transformers rounds it: inv_freq = float(1 / theta^(2i/d)), angle = float(pos) *
// inv_freq in fp32, then cos/sin of that float angle. head_dim must be even.
void rope_forward(float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                  int64_t head_dim, float theta);
// The backward of a rotation is the inverse rotation: dx rotated in place by -angle.
void rope_backward(float* dx, const int32_t* positions, int64_t tokens, int64_t heads,
                   int64_t head_dim, float theta);

}  // namespace frugal::cpu
