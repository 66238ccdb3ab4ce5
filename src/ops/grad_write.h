// How an op writes a weight gradient it is handed (ParameterProvider::grads says which).
#pragma once

namespace frugal {

enum class GradWrite {
  // dw += the op's gradient: micro-batches, chunks and tied uses add up.
  kAdd,
  // dw = the op's gradient: dw holds nothing of this step yet, not even zeros (the provider
  // skipped clearing it, a pass over every gradient each step).
  kOverwrite,
};

}  // namespace frugal
