// Helpers for tests that compare two ways of training the same model: a seeded global batch
// that every rank draws alike and slices, and the largest weight difference between two
// parameter providers.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
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

// The derivative of a loss along a random direction u of one parameter tensor, two ways:
// analytic = <grad, u>, and numeric from central differences of loss() around the current
// values at h and h/2, combined by Richardson extrapolation so that the h^2 truncation error
// cancels (the models of the tests are far from linear at their init). `param` is restored.
struct DirectionalDerivative {
  double analytic = 0, numeric = 0;
};
inline DirectionalDerivative directional_derivative(Tensor param, const Tensor& grad,
                                                    std::mt19937& rng,
                                                    const std::function<double()>& loss) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Tensor saved = param.clone();
  std::vector<float> u(static_cast<size_t>(param.numel()));
  DirectionalDerivative d;
  for (int64_t i = 0; i < param.numel(); ++i) {
    u[size_t(i)] = normal(rng);
    d.analytic += double(grad.data<float>()[i]) * u[size_t(i)];
  }
  auto loss_at = [&](double t) {
    for (int64_t i = 0; i < param.numel(); ++i)
      param.data<float>()[i] = saved.data<float>()[i] + float(t) * u[size_t(i)];
    return loss();
  };
  const double h = 1e-2;
  const double d_h = (loss_at(h) - loss_at(-h)) / (2 * h);
  const double d_half = (loss_at(h / 2) - loss_at(-h / 2)) / h;
  d.numeric = (4 * d_half - d_h) / 3;
  param.copy_from(saved);
  return d;
}

}  // namespace frugal::test
