// Token embedding lookup and its backward (a scatter-add into the table's gradient).
#pragma once
#include <cstdint>

namespace frugal::cpu {

// out[t, :] = table[tokens[t], :]; tokens must lie in [0, vocab) (checked, throws Error).
void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n_tokens,
                       int64_t vocab, int64_t dim);
// dtable[tokens[t], :] += dout[t, :]  (accumulated; deterministic order: each element sums its
// tokens in order t = 0, 1, ...). The tokens are checked as in the forward.
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n_tokens,
                        int64_t vocab, int64_t dim);

}  // namespace frugal::cpu
