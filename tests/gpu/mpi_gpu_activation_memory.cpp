// The chunked MLP and activation offload on GPUs (ZeRO-3 over NCCL on 1 or 2 ranks, bf16
// compute): for every checkpoint policy, 3 AdamW steps with offloaded inputs (pinned host
// memory, copies on the communication stream) give the plain run's losses bit for bit, and the
// MLP in chunks of 16 rows (alone and with offload) gives them to fp32 tolerance (cuBLASLt
// picks its GEMM by the rows; the weight gradients sum over the chunks). The pinned arena holds
// every block's input but the last, and gives them all back.
#include <cmath>
#include <vector>

#include "catch_compat.h"
#include "core/device.h"
#include "gpu_support.h"
#include "model/llama_model.h"
#include "model_support.h"
#include "optim/adamw.h"
#include "parallel/zero3_parameters.h"
#include "train/train_step.h"

using namespace frugal;

namespace {

constexpr int64_t kGlobalBatch = 4, kSteps = 3, kSeq = 45;

LlamaConfig config() {
  LlamaConfig c;
  c.hidden_size = 256;
  c.intermediate_size = 688;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 301;
  c.max_position_embeddings = 128;
  return c;
}

std::vector<double> train(Comm& nccl, DeviceContext& gpu, CheckpointPolicy policy, int64_t chunk,
                          Arena* offload) {
  const LlamaConfig c = config();
  LlamaModel model(c);
  model.set_mlp_chunk_tokens(chunk);
  model.set_input_offload(offload);
  SubArena params("parameter shards", gpu.device_memory()),
      grads("gradient shards", gpu.device_memory()), gathered("gathered", gpu.device_memory()),
      copies("bf16 copies", gpu.device_memory()), optim("optimizer", gpu.device_memory());
  Zero3Parameters sharded(llama_units(c), nccl, {&params, &grads, &gathered, &copies, DType::f32},
                          3, 0.02f);
  AdamW opt(sharded.trainable(), {0.9, 0.95, 1e-8, 0.1, 1.0}, optim);
  const int64_t per_rank = kGlobalBatch / nccl.size();
  std::vector<double> losses;
  for (int64_t step = 1; step <= kSteps; ++step) {
    const Batch b = test::slice_of_random_batch(77, kGlobalBatch, kSeq, c.vocab_size,
                                                nccl.rank() * per_rank, per_rank, 11);
    losses.push_back(train_step(model, sharded, opt, {b}, &nccl, 1e-3, step, policy).loss);
  }
  return losses;
}

}  // namespace

TEST_CASE("chunked MLP and offloaded inputs on GPUs train like the plain path", "[gpu][train]") {
  const auto world = test::make_gpu_world();
  if (!world) return;
  Comm& nccl = *world->nccl;
  DeviceContext& gpu = *world->gpu;
  const int64_t tokens = kGlobalBatch / nccl.size() * kSeq;
  for (CheckpointPolicy policy :
       {CheckpointPolicy::none, CheckpointPolicy::selective, CheckpointPolicy::full}) {
    INFO(checkpoint_policy_name(policy) << " on " << nccl.size() << " GPU(s)");
    SubArena pinned("activation inputs (pinned host, offloaded)", gpu.pinned_memory());
    const std::vector<double> plain = train(nccl, gpu, policy, 0, nullptr);
    const std::vector<double> offloaded = train(nccl, gpu, policy, 0, &pinned);
    const std::vector<double> chunked = train(nccl, gpu, policy, 16, nullptr);
    const std::vector<double> both = train(nccl, gpu, policy, 16, &pinned);
    for (int64_t s = 0; s < kSteps; ++s) {
      INFO("step " << s + 1 << ": plain " << plain[s] << ", offloaded " << offloaded[s]
                   << ", chunked " << chunked[s] << ", both " << both[s]);
      CHECK(offloaded[s] == plain[s]);
      CHECK(chunked[s] == Approx(plain[s]).epsilon(1e-4));
      CHECK(both[s] == chunked[s]);
    }
    // 2 of the 3 blocks' inputs, bf16, [tokens, 256].
    CHECK(pinned.stats().peak_bytes == size_t(2 * tokens * 256 * 2));
    CHECK(pinned.stats().in_use_bytes == 0);
  }
}
