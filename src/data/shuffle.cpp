// Portable seeded randomness: rejection-sampled bounded draws and Fisher-Yates.
#include "data/shuffle.h"

#include <numeric>

#include "core/error.h"

namespace frugal {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t bounded_random(std::mt19937_64& rng, uint64_t bound) {
  FRUGAL_CHECK(bound > 0, "bound ", bound);
  // Reject the lowest (2^64 mod bound) values so that every residue is equally likely.
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

std::mt19937_64 seeded_engine(uint64_t seed, uint64_t stream) {
  return std::mt19937_64(splitmix64(splitmix64(seed) ^ stream));
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream) {
  FRUGAL_CHECK(n >= 0, "n ", n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::mt19937_64 rng = seeded_engine(seed, stream);
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(bounded_random(rng, static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

}  // namespace frugal
