// SlabArena: first-fit carving of small tensors out of slabs (slab_arena.h).
#include "core/slab_arena.h"

#include <iterator>

namespace frugal {

SlabArena::SlabArena(std::string name, Arena& parent, size_t slab_bytes)
    : Arena(std::move(name), parent.device()), parent_(parent), slab_bytes_(slab_bytes) {
  FRUGAL_CHECK(slab_bytes_ >= 4 * kAlignment && slab_bytes_ % kAlignment == 0, "slab size ",
               slab_bytes_, " is not a multiple of ", kAlignment);
}

SlabArena::~SlabArena() {
  // Tensors that outlive their arena are a bug elsewhere; give the slabs back regardless.
  for (auto& slab : slabs_) parent_.release(slab->base, slab_bytes_);
}

void* SlabArena::raw_allocate(size_t bytes, const std::string& what) {
  if (!packs(bytes)) {
    void* ptr = parent_.allocate(bytes, what + " (" + name() + ")");
    placements_.emplace(ptr, Placement{nullptr, 0, bytes});
    return ptr;
  }
  const size_t rounded = carved_bytes(bytes);
  auto carve = [&](Slab& slab) -> void* {
    for (auto it = slab.free_ranges.begin(); it != slab.free_ranges.end(); ++it) {
      if (it->second < rounded) continue;
      const size_t offset = it->first, left = it->second - rounded;
      slab.free_ranges.erase(it);
      if (left > 0) slab.free_ranges.emplace(offset + rounded, left);
      ++slab.live;
      void* ptr = slab.base + offset;
      placements_.emplace(ptr, Placement{&slab, offset, rounded});
      return ptr;
    }
    return nullptr;
  };
  for (auto& slab : slabs_)
    if (void* ptr = carve(*slab)) return ptr;
  auto slab = std::make_unique<Slab>();
  slab->base =
      static_cast<char*>(parent_.allocate(slab_bytes_, what + " (a slab of " + name() + ")"));
  slab->free_ranges.emplace(0, slab_bytes_);
  slabs_.push_back(std::move(slab));
  return carve(*slabs_.back());
}

void SlabArena::raw_release(void* ptr) {
  auto it = placements_.find(ptr);
  FRUGAL_CHECK(it != placements_.end(), "release of a block ", name(), " did not hand out");
  const Placement p = it->second;
  placements_.erase(it);
  if (!p.slab) {
    parent_.release(ptr, p.bytes);
    return;
  }
  Slab& slab = *p.slab;
  if (--slab.live == 0) {  // the whole slab is free: back to the parent
    parent_.release(slab.base, slab_bytes_);
    for (auto s = slabs_.begin(); s != slabs_.end(); ++s)
      if (s->get() == &slab) {
        slabs_.erase(s);
        break;
      }
    return;
  }
  // Merge with the free ranges on either side.
  size_t offset = p.offset, bytes = p.bytes;
  auto next = slab.free_ranges.lower_bound(offset);
  if (next != slab.free_ranges.end() && next->first == offset + bytes) {
    bytes += next->second;
    next = slab.free_ranges.erase(next);
  }
  if (next != slab.free_ranges.begin()) {
    auto before = std::prev(next);
    if (before->first + before->second == offset) {
      before->second += bytes;
      return;
    }
  }
  slab.free_ranges.emplace(offset, bytes);
}

}  // namespace frugal
