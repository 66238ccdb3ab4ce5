// Small elementwise helpers the model needs between the big kernels.
#pragma once
#include <cstdint>

namespace frugal::cpu {

void add_inplace(float* y, const float* x, int64_t n);                  // y += x
// bf16 y (raw bits) += fp32 x, the sum rounded to nearest even once: the gradients of a bf16
// master added into its bf16 gradient shard (the GPU's add of f32 into bf16, rounded alike).
void add_inplace(uint16_t* y, const float* x, int64_t n);
void scale_inplace(float* y, float s, int64_t n);                       // y *= s
void add_scaled_inplace(float* y, const float* x, float s, int64_t n);  // y += s * x
// bf16 <-> fp32 (raw bf16 bits), rounded as frugal::float_to_bf16 rounds: the host side of
// offloaded weights (the bf16 copies a GPU reads are made from fp32 masters in host memory).
// Inverted dropout: y[i] = x[i] * 1/(1-p) where dropout_keeps(seed, first + i, p), else 0 (y
// may alias x; `first`: x[0]'s index in the whole tensor when x is a chunk of its rows). Its
// backward is the same function of the output gradient.
void dropout(float* y, const float* x, int64_t n, float p, uint64_t seed, int64_t first = 0);
void f32_to_bf16(uint16_t* out, const float* in, int64_t n);
void bf16_to_f32(float* out, const uint16_t* in, int64_t n);

}  // namespace frugal::cpu
