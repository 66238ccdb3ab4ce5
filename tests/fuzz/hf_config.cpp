// Fuzz target: a Hugging Face model directory's config.json, beside valid weights of a tiny
// Llama (hidden 8, 2 layers, GQA 2:1, vocabulary 32). Opening the directory parses the config
// (types, ranges, fractional sizes, architectures, token ids) and checks it against the weights
// (every tensor present with the shape the config implies, none left unused); when it opens,
// every parameter is read (the NaN/infinity check included).
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "fuzz_support.h"
#include "model/hf_model.h"
#include "model/llama_config.h"
#include "ops/ops.h"

namespace {

std::string model_dir() {
  using namespace frugal;
  static const std::string dir = [] {
    LlamaConfig config;
    config.hidden_size = 8;
    config.intermediate_size = 12;
    config.num_hidden_layers = 2;
    config.num_attention_heads = 2;
    config.num_key_value_heads = 1;
    config.vocab_size = 32;
    config.max_position_embeddings = 64;
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const UnitSpec& unit : llama_units(config))
      for (const ParamSpec& p : unit.params) {
        Tensor t = ops::zeros(p.shape, DType::f32, host_arena());
        for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.01f * float(i % 17);
        tensors.emplace_back(p.name, t);
      }
    const std::string d = fuzz::scratch_dir() + "/model";
    fuzz::write_scratch("model/.keep", "");
    write_safetensors(d + "/model.safetensors", tensors, DType::bf16);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace frugal;
  const std::string dir = model_dir();
  fuzz::write_scratch("model/config.json", data, size);
  try {
    const HfModelDir model(dir);
    for (const UnitSpec& unit : model.specs())
      for (const ParamSpec& p : unit.params) model.read(p.name);
  } catch (const Error&) {
  }
  return 0;
}
