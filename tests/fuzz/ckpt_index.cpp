// Fuzz target: a checkpoint's index.h5, as step 4's of a checkpoint with an intact step 2
// (tiny_checkpoint.h), read as `ckpt verify` and resume read it: in the checking child process
// (RankFileChecker, kept from input to input as in ckpt_rank_file), where HDF5 lists the files
// its virtual datasets read. Step 4's COMMITTED is made as frugal wrote it before index.h5's
// CRC32C was kept there, so that HDF5's reading judges each input (with the checksum, any
// change is refused before anything else could matter). The check must accept step 4 (the
// resume then loads it) or refuse it naming index.h5 (the resume falls back to step 2 with its
// exact values): never a crash of this process, never an Error out of the resume, never the
// check and the resume disagreeing.
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_manager.h"
#include "ckpt/step_check.h"
#include "fuzz_support.h"
#include "tiny_checkpoint.h"

namespace {

struct Root {
  std::string path;
  frugal::RankFileChecker* checker;  // never destroyed: its child ends with this process
};

const Root& root() {
  static const Root r = [] {
    Root made;
    made.path = frugal::fuzz::scratch_dir() + "/ckpt";
    frugal::fuzz::save_tiny_checkpoints(made.path);
    // COMMITTED without the index's checksum: a step committed before 2026-12-04.
    const std::string committed = "ckpt/step_00000004/COMMITTED";
    nlohmann::json mark = nlohmann::json::parse(frugal::fuzz::read_scratch(committed));
    mark.erase("index_crc32c");
    frugal::fuzz::write_scratch(committed, mark.dump() + "\n");
    made.checker = new frugal::RankFileChecker;
    return made;
  }();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace frugal;
  const Root& r = root();
  fuzz::write_scratch("ckpt/step_00000004/index.h5", data, size);
  fuzz::TinyState state;
  int64_t step = -1;
  bool accepted = false;
  // A second is far more than a sound file takes; a starved fuzzer is given 5 s on a second try
  // (as in ckpt_rank_file), where a real failure fails again.
  for (double limit_s : {1.0, 5.0}) {
    try {
      CheckpointDir dir(r.path);
      dir.set_check_time_limit(limit_s);
      const StepCheck check = check_step(*r.checker, dir, 4);
      accepted = check.ok();
      if (!accepted && check.error.find("index.h5") == std::string::npos)
        fuzz::finding("step 4 refused without naming index.h5: " + check.error);
      CheckpointManager manager = fuzz::tiny_manager(r.path, state, limit_s);
      step = manager.resume(INT64_MAX, r.checker);
      break;
    } catch (const Error& e) {
      if (limit_s > 1.0) fuzz::finding(std::string("the resume failed: ") + e.what());
    }
  }
  if (step != (accepted ? 4 : 2))
    fuzz::finding("verify's check " + std::string(accepted ? "accepted" : "refused") +
                  " step 4, the resume ended on step " + std::to_string(step));
  if (!state.holds_step(step)) fuzz::finding("step " + std::to_string(step) + " with other values");
  return 0;
}
