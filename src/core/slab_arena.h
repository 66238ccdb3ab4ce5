// An accounting domain that packs its small tensors into large slabs taken from another arena.
// A GPU's caching arena rounds every block above 1 MiB up to 2 MiB steps (core/device.cpp): a
// LoRA adapter's 2.75 MiB matrix takes a 4 MiB block, and at the Llama-2-7B shape with rank 64
// the adapters' masters, gradients, moments and copies waste about 0.5 GiB that way. The run's
// long-lived state (master shards, gradient shards, moments, weight copies) lives here instead:
// tensors up to a quarter of a slab are carved out of slabs, first fit, and their space goes
// back to their slab when they are dropped (neighbouring free ranges merge); a slab whose
// tensors are all gone goes back to the parent. Larger tensors come from the parent directly.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace frugal {

class SlabArena : public Arena {
 public:
  // Offsets inside a slab are multiples of this (cuBLAS and the copy engine's best alignment).
  static constexpr size_t kAlignment = 256;
  // 64 MiB slabs; tensors above slab_bytes / 4 bypass them.
  static constexpr size_t kDefaultSlabBytes = size_t(64) << 20;

  SlabArena(std::string name, Arena& parent, size_t slab_bytes = kDefaultSlabBytes);
  ~SlabArena() override;

  Arena& parent() const { return parent_; }
  size_t slab_bytes() const { return slab_bytes_; }
  // Whether a tensor of `bytes` is carved from slabs of slab_bytes (else the parent serves it
  // whole); and in this arena's.
  static bool packs(size_t bytes, size_t slab_bytes) { return bytes <= slab_bytes / 4; }
  bool packs(size_t bytes) const { return packs(bytes, slab_bytes_); }
  // The bytes a tensor of `bytes` takes in a slab.
  static size_t carved_bytes(size_t bytes) {
    return bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  // Slabs taken from the parent now.
  size_t slabs() const { return slabs_.size(); }

 protected:
  void* raw_allocate(size_t bytes, const std::string& what) override;
  void raw_release(void* ptr) override;

 private:
  struct Slab {
    char* base = nullptr;
    size_t live = 0;                       // tensors carved from it
    std::map<size_t, size_t> free_ranges;  // offset -> bytes, disjoint, never adjacent
  };
  struct Placement {
    Slab* slab = nullptr;  // null: served by the parent directly
    size_t offset = 0, bytes = 0;
  };

  Arena& parent_;
  size_t slab_bytes_;
  std::vector<std::unique_ptr<Slab>> slabs_;  // in the order they were taken
  std::unordered_map<void*, Placement> placements_;
};

}  // namespace frugal
