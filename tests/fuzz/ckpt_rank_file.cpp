// Fuzz target: an HDF5 checkpoint rank file, resumed from. A checkpoint root holds two
// committed steps of a tiny run (tiny_checkpoint.h); the input replaces step 4's rank file,
// and the run resumes as `frugal train --train.resume=true` does: every file read through in a
// child process first (so a file that makes HDF5 itself crash or hang only makes its step
// unusable), then loaded here. The child is the product's fork server (RankFileChecker), kept
// from input to input: forked again only when an input crashed or hung it, so the fork that
// costs tens of milliseconds under AddressSanitizer is not paid per input. The resume must end on
// step 4 (the input passed every check) or fall back to step 2 with exactly step 2's values: never
// crash, never an Error, never other values.
#include <filesystem>

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
    made.checker = new frugal::RankFileChecker;
    return made;
  }();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace frugal;
  const Root& r = root();
  fuzz::write_scratch("ckpt/step_00000004/rank_00000.h5", data, size);
  fuzz::TinyState state;
  int64_t step = -1;
  try {
    // Reading a file through takes milliseconds here; a second means HDF5 is looping.
    CheckpointManager manager = fuzz::tiny_manager(r.path, state, /*check_time_limit_s=*/1);
    step = manager.resume(INT64_MAX, r.checker);
  } catch (const Error&) {
    // Step 2 is intact, so the resume must find it; but a fuzzer starved of CPU (niced beside
    // other work) can take over a second to read it, which the check rightly takes for a hang.
    // Asked again with 5 s a file (a looping step 4 then costs 5 s, twice if judged again, under
    // libFuzzer's 20 s limit), a real failure fails again.
    try {
      CheckpointManager manager = fuzz::tiny_manager(r.path, state, /*check_time_limit_s=*/5);
      step = manager.resume(INT64_MAX, r.checker);
    } catch (const Error& e) {
      fuzz::finding(std::string("the resume failed: ") + e.what());
    }
  }
  if (step != 4 && step != 2) fuzz::finding("resumed at step " + std::to_string(step));
  if (step == 2 && !state.holds_step(2)) fuzz::finding("step 2 resumed with other values");
  return 0;
}
