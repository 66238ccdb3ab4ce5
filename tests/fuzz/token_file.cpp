// Fuzz target: a token file (.tok): the 64-byte header (magic, version, id width, counts,
// vocabulary, bos/eos, header size) and the ids. Opening validates the header and the file size
// against it (with checked arithmetic) and every id against the vocabulary; then the ids are
// read back.
#include "data/token_file.h"

#include "core/error.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace frugal;
  const std::string path = fuzz::write_scratch("train.tok", data, size);
  try {
    read_token_file_header(path);
  } catch (const Error&) {
  }
  try {
    const TokenFile file(path);
    const std::vector<int32_t> ids = file.read_all();
    for (int32_t id : ids)
      if (id < 0 || static_cast<uint32_t>(id) >= file.header().vocab_size) abort();
  } catch (const Error&) {
  }
  return 0;
}
