// Fuzz target: a .cfg file as `frugal train run.cfg` reads it: INI sections and keys (unknown
// ones refused), every value parsed by its key's type and range, then the whole configuration
// resolved and validated.
#include "app/options.h"
#include "core/error.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace frugal;
  const std::string path = fuzz::write_scratch("run.cfg", data, size);
  try {
    parse_train_options({path});
  } catch (const Error&) {
  }
  return 0;
}
