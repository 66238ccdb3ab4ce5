// Token embedding lookup and its backward (a scatter-add into the table's gradient).
#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace frugal::cpu {

namespace {

// Checked before any thread starts: an exception must not leave an OpenMP region.
void check_tokens(const char* what, const int32_t* tokens, int64_t n_tokens, int64_t vocab) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (tokens[t] < 0 || tokens[t] >= vocab) {
      fail(what, ": token id ", tokens[t], " at position ", t, " is outside the vocabulary [0, ",
           vocab, ")");
    }
  }
}

// The backward splits the table's columns among threads; each thread walks all tokens in
// order, so every element is summed in token order whatever the thread count.
constexpr int64_t kColumnBlock = 64;

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t n_tokens,
                       int64_t vocab, int64_t dim) {
  check_tokens("embedding", tokens, n_tokens, vocab);
#pragma omp parallel for schedule(static) if (n_tokens * dim >= (1 << 15))
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::memcpy(out + t * dim, table + static_cast<int64_t>(tokens[t]) * dim,
                sizeof(float) * static_cast<size_t>(dim));
  }
}

void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t n_tokens,
                        int64_t vocab, int64_t dim) {
  check_tokens("embedding backward", tokens, n_tokens, vocab);
  const int64_t n_blocks = (dim + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n_tokens * dim >= (1 << 15))
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t c0 = b * kColumnBlock;
    const int64_t c1 = std::min(dim, c0 + kColumnBlock);
    for (int64_t t = 0; t < n_tokens; ++t) {
      float* dst = dtable + static_cast<int64_t>(tokens[t]) * dim;
      const float* src = dout + t * dim;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace frugal::cpu
