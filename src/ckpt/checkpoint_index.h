// index.h5 of a committed step: one virtual dataset per tensor, under the rank files' names
// ("model/<hf name>", "optim/exp_avg/<hf name>", ...), that maps every rank file's row shard
// into the whole tensor, so that h5py or h5dump read any full tensor without knowing the
// sharding. HDF5 fills the rows of a missing source file with zeros, silently: a reader must
// check that every source exists first (checkpoint_index_sources; `frugal ckpt verify` and
// tools/read_checkpoint.py do).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace frugal {

struct IndexEntry {
  std::string name;  // the dataset's name in the rank files
  Shape full_shape;
  bool replicated = false;  // whole in rank 0's file only
};

// Writes <step_dir>/index.h5 (temporary name, fsync, rename) for a checkpoint saved by
// `world_size` ranks in the ZeRO-3 row layout (rank k: rows [k s, (k + 1) s), s = ceil(rows /
// world_size), in a dataset of s rows).
void write_checkpoint_index(const std::string& step_dir, int world_size,
                            const std::vector<IndexEntry>& entries);

// The source files that index.h5's virtual datasets read (relative to its directory),
// without repeats; an Error when it cannot be read.
std::vector<std::string> checkpoint_index_sources(const std::string& index_path);

}  // namespace frugal
