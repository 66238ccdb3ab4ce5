// Helpers for tests that compare two ways of training the same model: a seeded global batch
// that every rank draws alike and slices, and the largest weight difference between two
// parameter providers.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/llama_model.h"

namespace frugal::test {

// Sequences [first, first + count) of a global batch of `total` random sequences of `seq`
// tokens drawn from `seed`; every `mask_every`-th target is masked (-1).
inline Batch slice_of_random_batch(uint32_t seed, int64_t total, int64_t seq, int64_t vocab,
                                   int64_t first, int64_t count, int64_t mask_every) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(total * seq), targets(total * seq);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int32_t(rng() % vocab);
    targets[i] = int64_t(i) % mask_every == 2 ? -1 : int32_t(rng() % vocab);
  }
  Batch b;
  b.batch = count;
  b.seq = seq;
  b.tokens = Tensor::empty({count * seq}, DType::i32);
  b.targets = Tensor::empty({count * seq}, DType::i32);
  std::copy(tokens.begin() + first * seq, tokens.begin() + (first + count) * seq,
            b.tokens.data<int32_t>());
  std::copy(targets.begin() + first * seq, targets.begin() + (first + count) * seq,
            b.targets.data<int32_t>());
  b.positions = sequence_positions(count, seq);
  return b;
}

// The largest |a - b| over every weight, gathering each unit of both providers (a collective
// when one of them is sharded); `worst` names the parameter where it occurs.
inline double max_weight_difference(ParameterProvider& a, ParameterProvider& b,
                                    const std::vector<UnitSpec>& units, std::string* worst) {
  double largest = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    std::vector<Tensor> wa = a.gather(int64_t(u)), wb = b.gather(int64_t(u));
    for (size_t i = 0; i < wa.size(); ++i)
      for (int64_t j = 0; j < wa[i].numel(); ++j) {
        const double d = std::abs(double(wa[i].data<float>()[j]) - wb[i].data<float>()[j]);
        if (d > largest) {
          largest = d;
          if (worst) *worst = units[u].params[i].name;
        }
      }
    a.release(int64_t(u));
    b.release(int64_t(u));
  }
  return largest;
}

}  // namespace frugal::test
