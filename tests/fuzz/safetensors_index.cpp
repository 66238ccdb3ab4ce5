// Fuzz target: model.safetensors.index.json beside two valid shards. Opening the set validates
// the index (JSON, a "weight_map" object of tensor -> shard file names in the same directory)
// and opens every shard it names; then every tensor is looked up through it.
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "fuzz_support.h"
#include "ops/ops.h"

namespace {

// The two shards (written once): "a" and "b" in the first, "c" in the second.
std::string model_dir() {
  using namespace frugal;
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/model";
    fuzz::write_scratch("model/.keep", "");
    auto tensor = [](Shape shape, float first) {
      Tensor t = ops::zeros(shape, DType::f32, host_arena());
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = first + 0.5f * float(i);
      return t;
    };
    write_safetensors(d + "/model-00001-of-00002.safetensors",
                      {{"a", tensor({2, 3}, 1)}, {"b", tensor({4}, -2)}}, DType::f32);
    write_safetensors(d + "/model-00002-of-00002.safetensors", {{"c", tensor({3, 2}, 0)}},
                      DType::bf16);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace frugal;
  const std::string dir = model_dir();
  fuzz::write_scratch("model/model.safetensors.index.json", data, size);
  try {
    const SafetensorsSet set(dir);
    for (const std::string& name : set.tensor_names()) set.file_of(name).read(name);
  } catch (const Error&) {
  }
  return 0;
}
