// A model for eval and generate spread over the ranks as training spreads it: ZeRO-3 shards
// of every weight over every rank (each rank reads only its own rows of the files), on the
// CPU or one GPU per rank, optionally with the block projections in 4 bits. A model that fits
// only sharded (70B in NF4 over two 24 GiB cards) can then be evaluated and sampled.
#pragma once

#include <memory>
#include <string>

#include "config/train_config.h"
#include "model/llama_config.h"
#include "model/parameter_provider.h"
#include "parallel/mesh.h"
#include "quant/quantized_parameters.h"

namespace frugal {

class Zero3Parameters;
struct RunMemory;

struct ShardedModelOptions {
  std::string hf_dir;     // a Hugging Face directory, or
  std::string ckpt_path;  // a frugal run / ckpt / step directory (exactly one of the two)
  DeviceChoice device = DeviceChoice::automatic;
  QuantKind quant = QuantKind::none;  // nf4 / hqq: the block projections stored 4-bit
  std::string gpu_mem_limit = "0";    // as parallel.gpu_mem_limit
  double timeout_s = 300;             // as parallel.timeout_s
};

// --device's value: auto, cpu or cuda; anything else is an Error naming `command` and the option.
DeviceChoice device_choice_from_option(const std::string& command, const std::string& text);

class ShardedModel {
 public:
  // `command` ("eval", "generate") names the caller in messages. Collective: every rank
  // constructs it with the same options.
  ShardedModel(const std::string& command, const ShardedModelOptions& options);
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  const LlamaConfig& config() const { return config_; }
  ParameterProvider& params();
  Comm& world() { return *host_mesh_.world; }
  bool on_gpu() const { return use_gpu_; }
  // "Hugging Face model 'DIR'" / "checkpoint 'STEP_DIR'"; the model's tokenizer.model (empty
  // when none); bos / eos from config.json or the tokenizer, else 1 and 2.
  const std::string& source() const { return source_; }
  const std::string& tokenizer_path() const { return tokenizer_path_; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  // One line: ranks, device, bytes of weights per rank.
  std::string describe() const;

 private:
  LlamaConfig config_;
  std::string source_, tokenizer_path_;
  int32_t bos_id_ = -1, eos_id_ = -1;
  bool use_gpu_ = false;
  ParallelConfig parallel_;
  Mesh host_mesh_;
  std::unique_ptr<RunMemory> memory_;  // before every part that allocates from it
  Mesh gpu_mesh_;                      // NCCL's barrier buffer is in memory_'s device arena
  std::unique_ptr<Zero3Parameters> params_;
};

}  // namespace frugal
