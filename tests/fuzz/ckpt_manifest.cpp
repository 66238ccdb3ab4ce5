// Fuzz target: the text files and the manifest of a checkpoint, with valid checksums: what a
// buggy or foreign writer could leave. The first byte picks the file:
//   0: step 4's COMMITTED (the step, its number of rank files and index.h5's CRC32C),
//   1: LATEST (the newest step's name),
//   else: the manifest of a rank file (JSON), checked as check_step and load do it: parsed,
//   its world size, its agreement with itself as rank 0's and with a real rank 0's manifest as
//   rank 1's, then its values given to the run's parts (a tiny part, the model's shape, the
//   keys in force, the data sampler); a restored sampler must then hand out a batch.
// Errors (and nlohmann's type errors, which resume reports as a malformed manifest) are the
// answers; nothing else may escape.
#include <algorithm>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/checkpoint_manager.h"
#include "data/sampler.h"
#include "fuzz_support.h"
#include "model/llama_config.h"
#include "tiny_checkpoint.h"
#include "train/run_state.h"

namespace {

using namespace frugal;

struct Run {
  std::string root;
  nlohmann::json rank0_manifest;  // step 4's, as saved
  LlamaConfig model;
  std::map<std::string, std::string> resolved{{"train.lr", "0.001"}, {"train.seed", "7"}};
  std::vector<int32_t> tokens;
};

const Run& run() {
  static const Run r = [] {
    Run made;
    made.root = fuzz::scratch_dir() + "/ckpt";
    fuzz::save_tiny_checkpoints(made.root);
    made.rank0_manifest = CheckpointDir(made.root).manifest(4);
    for (int i = 0; i < 200; ++i) made.tokens.push_back(i % 50);
    return made;
  }();
  return r;
}

void check_manifest(const Run& r, const std::string& text) {
  const std::string path = "manifest";
  const nlohmann::json manifest = parse_manifest(path, text);
  manifest_world_size(path, manifest);
  check_manifest_agrees(path, manifest, manifest, 4, 0);
  try {
    check_manifest_agrees(path, manifest, r.rank0_manifest, 4, 1);
  } catch (const Error&) {
  }
  fuzz::TinyState tiny;
  ModelShapeState model(r.model);
  ResolvedConfigState keys(r.resolved);
  SamplerConfig sampling;
  sampling.seq_len = 8;
  sampling.micro_batch_size = 2;
  BatchSampler sampler(view_of(r.tokens), sampling);
  try {
    CheckpointManager::load_values(
        {{"tiny", &tiny}, {"model", &model}, {"config", &keys}, {"sampler", &sampler}}, manifest,
        "checkpoint step 4");
  } catch (const nlohmann::json::exception&) {
    return;
  }
  const TokenBatch batch = sampler.next();
  for (int64_t i = 0; i < batch.inputs.numel(); ++i)
    if (batch.inputs.data<int32_t>()[i] < 0 || batch.inputs.data<int32_t>()[i] >= 50) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Run& r = run();
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] == 0 || data[0] == 1) {
      const std::string file = data[0] == 0 ? "ckpt/step_00000004/COMMITTED" : "ckpt/LATEST";
      const fuzz::ScratchReplacement replaced(file, text);
      const CheckpointDir dir(r.root);
      const std::vector<int64_t> steps = dir.committed_steps();
      dir.latest_problem();
      dir.committed_world_size(4);
      dir.commit_mark(4);
      dir.incomplete_steps();
      // Step 2 is intact whatever the file says.
      if (std::find(steps.begin(), steps.end(), 2) == steps.end()) abort();
    } else {
      check_manifest(r, text);
    }
  } catch (const Error&) {
  }
  return 0;
}
