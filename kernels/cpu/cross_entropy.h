// Cross-entropy of logits against target ids with a loss mask: a target < 0 (e.g. -100, as in
// Hugging Face) contributes nothing. Computed in fp64 row sums for stability.
#pragma once
#include <cstdint>

namespace frugal::cpu {

// Returns the SUM of -log softmax(logits[r])[targets[r]] over rows with targets[r] >= 0
// (targets must be < vocab; checked, throws Error). When dlogits is not null it is
// overwritten with grad_scale * (softmax(logits[r]) - onehot(targets[r])) for counted rows
// and 0 for masked rows; callers pass grad_scale = 1 / (number of counted tokens). The returned
// sum does not depend on grad_scale.
double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int64_t rows,
                     int64_t vocab, float grad_scale);

}  // namespace frugal::cpu
