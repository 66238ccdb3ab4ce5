// Fuzz target: something other than a regular file at a path frugal reads. The input's first
// byte picks the path (modulo their number), its second the kind (a FIFO, a directory, a
// symlink loop, /dev/zero through a symlink, a dangling symlink); the rest is unused, so the
// seeds (every path with every kind) are all the inputs there are, and the replay in
// tools/test runs every one. The paths:
//   - in a checkpoint of steps 2 and 4 (tiny_checkpoint.h): LATEST, step 4's directory, its
//     COMMITTED, rank file and index.h5, step 2's rank file. `ckpt verify`'s check must accept
//     step 4 or refuse it naming the path, and the resume must end on step 4 or fall back to
//     step 2 with its exact values, agreeing with the check;
//   - in a Hugging Face directory of a tiny Llama: config.json, model.safetensors; and in a
//     sharded one, model.safetensors.index.json and a shard; a tokenizer.json and a
//     tokenizer.model: opening must be an Error that names the path and what is there.
// Nothing may block (a FIFO opened with a plain open() waits for a writer forever): an alarm
// ends an input that takes 30 s, which is a finding.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_manager.h"
#include "ckpt/safetensors.h"
#include "ckpt/step_check.h"
#include "data/tokenizer.h"
#include "fuzz_support.h"
#include "model/hf_model.h"
#include "model/llama_config.h"
#include "ops/ops.h"
#include "tests/non_regular_files.h"
#include "tiny_checkpoint.h"

namespace {

using namespace frugal;
namespace fs = std::filesystem;

// Paths under the scratch directory.
const char* const kPaths[] = {
    "ckpt/LATEST",
    "ckpt/step_00000004",
    "ckpt/step_00000004/COMMITTED",
    "ckpt/step_00000004/rank_00000.h5",
    "ckpt/step_00000004/index.h5",
    "ckpt/step_00000002/rank_00000.h5",
    "model/config.json",
    "model/model.safetensors",
    "sharded/model.safetensors.index.json",
    "sharded/model-00002-of-00002.safetensors",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer.model",
};
constexpr size_t kPathCount = sizeof kPaths / sizeof kPaths[0];

// A tiny Llama's weights and config.json in `dir`: one file, or two shards and an index.
void write_model(const std::string& dir, bool sharded) {
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
    for (const ParamSpec& p : unit.params)
      tensors.emplace_back(p.name, ops::zeros(p.shape, DType::f32, host_arena()));
  fs::create_directories(dir);
  fuzz::write_scratch(fs::path(dir).filename().string() + "/config.json",
                      hf_config_json(config, DType::bf16).dump());
  if (!sharded) {
    write_safetensors(dir + "/model.safetensors", tensors, DType::bf16);
    return;
  }
  const size_t half = tensors.size() / 2;
  const std::string names[2] = {"model-00001-of-00002.safetensors",
                                "model-00002-of-00002.safetensors"};
  nlohmann::json map = nlohmann::json::object();
  for (size_t i = 0; i < tensors.size(); ++i) map[tensors[i].first] = names[i < half ? 0 : 1];
  write_safetensors(dir + "/" + names[0], {tensors.begin(), tensors.begin() + long(half)},
                    DType::bf16);
  write_safetensors(dir + "/" + names[1], {tensors.begin() + long(half), tensors.end()},
                    DType::bf16);
  fuzz::write_scratch(fs::path(dir).filename().string() + "/model.safetensors.index.json",
                      nlohmann::json{{"weight_map", map}}.dump());
}

// The scratch directory's checkpoint, models and tokenizer files as they are before an input
// replaces one path.
void make_everything() {
  const std::string scratch = fuzz::scratch_dir();
  for (const char* dir : {"ckpt", "model", "sharded", "tokenizer"})
    fs::remove_all(scratch + "/" + dir);
  fuzz::save_tiny_checkpoints(scratch + "/ckpt");
  write_model(scratch + "/model", false);
  write_model(scratch + "/sharded", true);
  fuzz::write_scratch("tokenizer/.keep", "");
}

// What the check and the resume make of the checkpoint; a finding unless they agree, the resume
// ends on a step with its exact values, and a refusal names `path`.
void check_checkpoint(const std::string& root, const std::string& path) {
  CheckpointDir dir(root);
  dir.set_check_time_limit(5);
  std::string refused;
  for (const auto& [step, problem] : dir.incomplete_steps())
    if (step == 4) refused = problem;
  const std::vector<int64_t> steps = dir.committed_steps();
  const bool committed = std::find(steps.begin(), steps.end(), 4) != steps.end();
  if (refused.empty() && !committed) refused = "'" + dir.step_dir(4) + "' is not committed";
  if (refused.empty()) refused = check_step(dir, 4).error;
  if (!refused.empty() && refused.find(path) == std::string::npos)
    fuzz::finding("step 4 refused without naming '" + path + "': " + refused);
  fuzz::TinyState state;
  int64_t step = -1;
  try {
    CheckpointManager manager = fuzz::tiny_manager(root, state, 5);
    step = manager.resume();
  } catch (const Error& e) {
    fuzz::finding(std::string("the resume failed: ") + e.what());
  }
  if (step != (refused.empty() ? 4 : 2))
    fuzz::finding("the check " + std::string(refused.empty() ? "accepted" : "refused") +
                  " step 4, the resume ended on step " + std::to_string(step));
  if (!state.holds_step(step)) fuzz::finding("step " + std::to_string(step) + " with other values");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  ::alarm(30);  // a blocked reader ends here, by SIGALRM: a finding
  make_everything();
  const std::string relative = kPaths[data[0] % kPathCount];
  const test::OddFile kind = test::odd_files()[data[1] % test::odd_files().size()];
  const std::string scratch = fuzz::scratch_dir();
  const std::string path = scratch + "/" + relative;
  test::make_odd_file(path, kind);
  const std::string said = std::string(test::odd_file_said(kind)) + ", not a regular file";
  const std::string area = relative.substr(0, relative.find('/'));
  if (area == "ckpt") {
    check_checkpoint(scratch + "/ckpt", path);
  } else {
    std::string error;
    try {
      if (area == "tokenizer")
        Tokenizer tokenizer(path);
      else
        HfModelDir model(scratch + "/" + area);
    } catch (const Error& e) {
      error = e.what();
    }
    if (error.find(path) == std::string::npos || error.find(said) == std::string::npos)
      fuzz::finding("'" + path + "' as a " + test::odd_file_name(kind) +
                    " was not refused by name: " + (error.empty() ? "no error" : error));
  }
  ::alarm(0);
  return 0;
}
