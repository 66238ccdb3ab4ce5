// A random QLoRA base made on the GPUs (Nf4Encoding::encode_seeded: rows drawn and quantized
// there) against the same base made on the host (init_parameter_rows, then nf4 quantization):
// every NF4 weight, gathered and dequantized to bf16 on the GPUs, equals the host's dequantized
// fp32 weight rounded to bf16, bit for bit, on 1 and 2 ranks (the dequantization itself is exact
// in both: tests/gpu/test_cuda_quant.cpp), so the codes, absmax codes, scales and offset agree.
#include <cstdint>
#include <vector>

#include "catch_compat.h"
#include "core/device.h"
#include "core/dtype.h"
#include "gpu_support.h"
#include "model/llama_config.h"
#include "model/lora.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "parallel/zero3_parameters.h"

using namespace frugal;

TEST_CASE("a seeded NF4 base made on GPUs equals the host's", "[gpu][quant]") {
  const auto world = test::make_gpu_world();
  if (!world) return;
  LlamaConfig config;
  config.hidden_size = 320;  // rows of whole blocks; row counts that split unevenly over 2 ranks
  config.intermediate_size = 576;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 5;
  config.num_key_value_heads = 1;
  config.vocab_size = 301;
  config.max_position_embeddings = 64;
  LoraConfig lora;
  lora.rank = 4;
  lora.targets = lora_targets_from_names("all");
  const std::vector<UnitSpec> units = lora_units(config, lora);
  Zero3Init init;
  init.nf4 = [](const ParamSpec& p) { return p.shape.size() == 2 && is_block_projection(p.name); };

  Arena host_params("host params", Device::cpu), host_grads("host grads", Device::cpu),
      host_gathered("host gathered", Device::cpu);
  Zero3Parameters on_host(units, *world->mpi, {&host_params, &host_grads, &host_gathered}, 7, 0.02f,
                          false, init);
  DeviceContext& gpu = *world->gpu;
  SubArena params("params", gpu.device_memory()), grads("grads", gpu.device_memory()),
      gathered("gathered", gpu.device_memory()), copies("copies", gpu.device_memory());
  Zero3Parameters on_gpu(units, *world->nccl, {&params, &grads, &gathered, &copies}, 7, 0.02f,
                         false, init);
  int64_t compared = 0;
  for (int64_t u = 0; u < int64_t(units.size()); ++u) {
    const std::vector<Tensor> want = on_host.gather(u);
    const std::vector<Tensor> got = on_gpu.gather(u);
    for (size_t i = 0; i < want.size(); ++i) {
      if (!on_gpu.is_quantized(u, i)) continue;
      INFO(units[size_t(u)].params[i].name);
      const Tensor host_bf16 = to_host(got[i], gpu.compute());
      const float* w = want[i].data<float>();
      const uint16_t* g = host_bf16.data<uint16_t>();
      int64_t differ = 0;
      for (int64_t k = 0; k < want[i].numel(); ++k) differ += g[k] != float_to_bf16(w[k]);
      CHECK(differ == 0);
      ++compared;
    }
    on_host.release(u);
    on_gpu.release(u);
  }
  CHECK(compared == 2 * 7);  // every projection of both layers
}
