// Fuzz target: one safetensors file (header length, JSON header, offsets, dtypes, shapes, data).
// Opening validates the header; then every tensor frugal reads as float is read whole and by
// rows, converting each element, as a Hugging Face load does.
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace frugal;
  const std::string path = fuzz::write_scratch("model.safetensors", data, size);
  try {
    const SafetensorsFile file(path);
    for (const std::string& name : file.tensor_names()) {
      const SafetensorsEntry& entry = file.entry(name);
      (void)file.metadata();
      try {
        safetensors_float_dtype(entry.dtype);
      } catch (const Error&) {
        continue;  // an integer tensor: frugal names it when it is asked to read one as float
      }
      const Tensor whole = file.read(name);
      const int64_t rows = entry.shape.empty() ? 1 : entry.shape[0];
      if (rows >= 2) file.read_rows(name, 1, rows);
    }
  } catch (const Error&) {
  }
  return 0;
}
