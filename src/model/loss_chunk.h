// How many rows of logits the head and the loss compute at once (LlamaModel: training's head
// forward + backward, evaluation's loss; train.loss_chunk_tokens): the [rows, vocab] logits and
// their gradient exist for one chunk at a time.
#pragma once

#include <cstdint>

namespace frugal {

// The default. Each chunk's weight-gradient GEMM reads and writes the head's whole fp32
// gradient, so fewer, larger chunks are faster where memory allows: 4096 rows against 1024
// measured 0.8-1.2 % more tokens/s on the TinyLlama-1.1B shape (32,000-token vocabulary) for
// 0.36 GiB more (H200, doc/benchmarks.md); 1024 keeps small cards' peaks, on which the memory
// plan's measured runs stand (tests/unit/test_plan.cpp).
inline constexpr int64_t kDefaultLossChunkTokens = 1024;

}  // namespace frugal
