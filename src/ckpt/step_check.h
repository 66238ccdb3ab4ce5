// Checking a committed step's files before anything trusts them: each rank file is read through
// (its manifest against rank 0's, every tensor's checksums) in a child process, and index.h5
// too, so that a damaged file that makes HDF5 crash or hang is reported by name ("damaged: HDF5
// crashed reading it") instead of taking the reader down. `frugal ckpt verify` and resume both use
// it, so they accept and refuse the same steps. One child reads file after file (RankFileChecker, a
// fork server): a fork costs more than reading a small file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/isolated.h"

namespace frugal {

struct RankFileCheck {
  int rank = 0;
  std::string path;
  std::string error;  // empty when the file is sound
  int64_t tensors = 0, bytes = 0;
};

struct StepCheck {
  int64_t step = 0;
  int world_size = 0;                // 0 when rank 0's manifest could not be read
  nlohmann::json manifest;           // rank 0's
  std::vector<RankFileCheck> files;  // the files checked, in rank order
  // index.h5, checked with rank 0's share when every rank file of the share is sound: whether
  // it was (false also for a step saved before index.h5 existed), and what is wrong with it
  // (empty when sound).
  bool index_checked = false;
  std::string index_error;
  std::string error;  // the first problem, naming its file; empty when sound
  bool ok() const { return error.empty(); }
};

// The child process that reads rank files through: forked at the first file, it reads file
// after file until one crashes it or hangs past its time limit (then the next file gets a fresh
// child, and a file that failed in a child that had read others is read again in a fresh one
// before it is blamed: IsolatedWorker). A child in which HDF5 still holds something open after a
// file (a failure inside HDF5 that leaked) ends after that file. Nothing of the directory is
// remembered in the child: each request names its file and carries rank 0's manifest.
class RankFileChecker {
 public:
  RankFileChecker();

  // Rank 0's file of `step`: its manifest, and when `verify`, every tensor read back. The
  // outcome's text, when ok, is the JSON {"manifest", "tensors", "bytes"}.
  IsolatedOutcome read_rank0(const CheckpointDir& dir, int64_t step, bool verify);
  // Rank `rank`'s file of `step` read through against rank 0's manifest; when ok, the text is
  // "<tensors> <bytes>".
  IsolatedOutcome read_rank(const CheckpointDir& dir, int64_t step, int rank,
                            const nlohmann::json& rank0_manifest);
  // `step`'s index.h5: its CRC32C, and the source files its virtual datasets read, listed by
  // HDF5 (which crashes or hangs on some damaged ones, as on rank files); when ok, the text is
  // the JSON {"crc32c", "sources"}.
  IsolatedOutcome read_index(const CheckpointDir& dir, int64_t step);

  // Child processes forked so far.
  int forks() const { return worker_.forks(); }

 private:
  IsolatedOutcome read_through(const std::string& path, const nlohmann::json& request,
                               double time_limit_s);
  IsolatedWorker worker_;
};

// Checks rank 0's manifest, then the rank files of `step` whose rank r has r % stride == first
// (every file with the defaults; the ranks of a resume each take a share, so that every file
// is read once), and with rank 0's share the step's index.h5: its CRC32C against COMMITTED's,
// and every source file it reads a rank file of the step that exists. Each file is read by
// `checker`'s child process, given dir.check_time_limit() before it counts as hung. A damaged
// index.h5 makes the step unusable for resume as for `ckpt verify`: the two apply one rule,
// and a step whose files were damaged after their commit is not one to trust.
StepCheck check_step(RankFileChecker& checker, const CheckpointDir& dir, int64_t step,
                     int first = 0, int stride = 1);
// The same with a checker of its own (one child for the step's files).
StepCheck check_step(const CheckpointDir& dir, int64_t step, int first = 0, int stride = 1);

}  // namespace frugal
