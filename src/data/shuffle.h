// Portable seeded randomness for the data layer: a bounded draw and a Fisher-Yates
// permutation that give the same numbers on every compiler and standard library.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace frugal {

// A uniform integer in [0, bound), bound > 0, without modulo bias. std::mt19937_64 is fully
// specified by the standard, but std::uniform_int_distribution and std::shuffle are not,
// so a data order built on them would change with the standard library.
uint64_t bounded_random(std::mt19937_64& rng, uint64_t bound);

// The engine for stream `stream` of seed `seed` (e.g. one per epoch): the two are mixed
// with splitmix64 so that neighbouring seeds and streams give unrelated sequences.
std::mt19937_64 seeded_engine(uint64_t seed, uint64_t stream = 0);

// A permutation of 0..n-1 by Fisher-Yates over seeded_engine(seed, stream).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream = 0);

}  // namespace frugal
