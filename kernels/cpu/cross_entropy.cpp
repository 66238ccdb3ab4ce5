// Cross-entropy of logits against target ids with a loss mask (target < 0 counts nothing),
// with row sums in fp64, and its gradient with respect to the logits.
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace frugal::cpu {

double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int64_t rows,
                     int64_t vocab, float grad_scale) {
  // Checked before any thread starts: an exception must not leave an OpenMP region.
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] >= vocab) {
      fail("cross_entropy: target id ", targets[r], " at row ", r,
           " is outside the vocabulary [0, ", vocab, ")");
    }
  }

  // Per-row losses, summed afterwards in row order so the total is deterministic.
  std::vector<double> row_loss(static_cast<size_t>(rows), 0.0);
#pragma omp parallel for schedule(static) if (rows * vocab >= (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const float* lr = logits + r * vocab;
    float* dr = dlogits != nullptr ? dlogits + r * vocab : nullptr;
    const int32_t target = targets[r];
    if (target < 0) {
      if (dr != nullptr) std::fill(dr, dr + vocab, 0.0f);
      continue;
    }
    const double max = *std::max_element(lr, lr + vocab);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(lr[j]) - max);
    const double lse = max + std::log(sum);
    row_loss[r] = lse - static_cast<double>(lr[target]);
    if (dr != nullptr) {
      for (int64_t j = 0; j < vocab; ++j) {
        dr[j] = static_cast<float>(grad_scale * std::exp(static_cast<double>(lr[j]) - lse));
      }
      dr[target] =
          static_cast<float>(grad_scale * (std::exp(static_cast<double>(lr[target]) - lse) - 1.0));
    }
  }

  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) total += row_loss[r];
  return total;
}

}  // namespace frugal::cpu
