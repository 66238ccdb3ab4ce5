// SlabArena (core/slab_arena.h): small tensors packed into slabs taken from a parent arena, their
// space reused once dropped, empty slabs given back, large tensors passed through; against an
// independent model that tracks each slab's bytes in a bitmap.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "catch_compat.h"
#include "core/slab_arena.h"

using namespace frugal;

namespace {

constexpr size_t kSlab = 64 * 1024;  // small slabs: the test's tensors are KiB, not MiB

// The parent: host memory that counts what it hands out.
struct CountingParent : Arena {
  CountingParent() : Arena("parent", Device::cpu) {}
};

}  // namespace

TEST_CASE("slab arena: small tensors share slabs, large ones come from the parent", "[memory]") {
  CountingParent parent;
  SlabArena arena("state", parent, kSlab);
  // Four tensors of 11 KiB + 1 byte: each takes 11 KiB + 256 in a slab, all four one slab, where
  // a block each would take four.
  std::vector<Tensor> t;
  for (int i = 0; i < 4; ++i) t.push_back(Tensor::empty({11 * 1024 + 1}, DType::u8, arena));
  CHECK(arena.slabs() == 1);
  CHECK(parent.stats().in_use_bytes == kSlab);
  CHECK(arena.stats().in_use_bytes == 4 * (11 * 1024 + 1));
  // Offsets in the slab are multiples of kAlignment (a GPU's slab itself starts 256-aligned).
  for (const Tensor& x : t)
    CHECK((static_cast<const char*>(x.raw()) - static_cast<const char*>(t[0].raw())) %
              ptrdiff_t(SlabArena::kAlignment) ==
          0);
  // Distinct, non-overlapping: write each with its own byte and read them all back.
  for (size_t i = 0; i < t.size(); ++i) std::memset(t[i].raw(), int(i + 1), t[i].bytes());
  for (size_t i = 0; i < t.size(); ++i) {
    const auto* p = static_cast<const unsigned char*>(t[i].raw());
    CHECK(std::all_of(p, p + t[i].bytes(), [&](unsigned char b) { return b == i + 1; }));
  }
  // Above a quarter of a slab: the parent's own allocation, exactly its size.
  Tensor large = Tensor::empty({kSlab / 4 + 1}, DType::u8, arena);
  CHECK(arena.slabs() == 1);
  CHECK(parent.stats().in_use_bytes == kSlab + kSlab / 4 + 1);
  large = Tensor();
  CHECK(parent.stats().in_use_bytes == kSlab);
  // The slab goes back when its last tensor does.
  t.clear();
  CHECK(arena.slabs() == 0);
  CHECK(parent.stats().in_use_bytes == 0);
  CHECK(arena.stats().in_use_bytes == 0);
}

TEST_CASE("slab arena: dropped space is reused, merged with its neighbours", "[memory]") {
  CountingParent parent;
  SlabArena arena("state", parent, kSlab);
  // Fill one slab exactly with 16 tensors of kSlab / 16.
  std::vector<Tensor> t;
  for (int i = 0; i < 16; ++i) t.push_back(Tensor::empty({kSlab / 16}, DType::u8, arena));
  REQUIRE(arena.slabs() == 1);
  const auto* base = static_cast<const char*>(t[0].raw());
  // Dropping tensors 5, 6 and 7 leaves a hole of three; a tensor of three fits there (the
  // ranges merged: none of them alone is large enough) and needs no second slab.
  t[5] = t[6] = t[7] = Tensor();
  Tensor three = Tensor::empty({3 * kSlab / 16}, DType::u8, arena);
  CHECK(arena.slabs() == 1);
  CHECK(static_cast<const char*>(three.raw()) - base == 5 * ptrdiff_t(kSlab / 16));
  // A fourth does not fit anywhere: a second slab.
  Tensor more = Tensor::empty({kSlab / 16}, DType::u8, arena);
  CHECK(arena.slabs() == 2);
  CHECK(parent.stats().in_use_bytes == 2 * kSlab);
}

TEST_CASE("slab arena: random churn never overlaps and gives every slab back", "[memory]") {
  CountingParent parent;
  SlabArena arena("state", parent, kSlab);
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> size(1, kSlab / 4);
  std::vector<Tensor> live;
  size_t peak_slabs = 0, live_bytes_peak = 0;
  for (int round = 0; round < 3000; ++round) {
    if (live.empty() || rng() % 3 != 0) {
      live.push_back(Tensor::empty({int64_t(size(rng))}, DType::u8, arena));
    } else {
      std::swap(live[rng() % live.size()], live.back());
      live.pop_back();
    }
    // The live tensors' ranges, sorted, never overlap (an independent check of the free lists).
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
    size_t bytes = 0;
    for (const Tensor& x : live) {
      const auto p = reinterpret_cast<uintptr_t>(x.raw());
      ranges.emplace_back(p, p + x.bytes());
      bytes += SlabArena::carved_bytes(x.bytes());
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) REQUIRE(ranges[i - 1].second <= ranges[i].first);
    peak_slabs = std::max(peak_slabs, arena.slabs());
    live_bytes_peak = std::max(live_bytes_peak, bytes);
    REQUIRE(parent.stats().in_use_bytes == arena.slabs() * kSlab);
  }
  // First fit with merging keeps the slabs within a small factor of the bytes ever live at once.
  CHECK(peak_slabs * kSlab <= 2 * live_bytes_peak + kSlab);
  live.clear();
  CHECK(arena.slabs() == 0);
  CHECK(parent.stats().in_use_bytes == 0);
}

TEST_CASE("slab arena: a parent at its cap refuses the slab, naming the tensor", "[memory]") {
  CountingParent parent;
  parent.set_limit(kSlab + kSlab / 2);
  SlabArena arena("optimizer state", parent, kSlab);
  Tensor a = Tensor::empty({kSlab / 4}, DType::u8, arena);
  Tensor b = Tensor::empty({kSlab / 4}, DType::u8, arena);
  Tensor c = Tensor::empty({kSlab / 4}, DType::u8, arena);
  Tensor d = Tensor::empty({kSlab / 4}, DType::u8, arena);
  CHECK(arena.slabs() == 1);
  try {
    Tensor e = Tensor::empty({kSlab / 4}, DType::u8, arena);
    FAIL("a second slab past the parent's cap was handed out");
  } catch (const Error& err) {
    const std::string what = err.what();
    CHECK(what.find("a slab of optimizer state") != std::string::npos);
  }
  // The arena is still usable: dropping a tensor makes room in the slab it has.
  a = Tensor();
  Tensor e = Tensor::empty({kSlab / 4}, DType::u8, arena);
  CHECK(arena.slabs() == 1);
}
