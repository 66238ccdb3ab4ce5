// Writes the seed inputs that come out of frugal's own writers (safetensors, token files,
// checkpoints) into tests/fuzz/corpus/<target>/: `fuzz_make_seeds CORPUS_DIR`. The text seeds
// (index, config.json, .cfg, corpora) are written by hand; `tools/fuzz --seeds` reruns this.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/safetensors.h"
#include "data/token_file.h"
#include "fuzz_support.h"
#include "model/llama_config.h"
#include "tests/non_regular_files.h"
#include "tiny_checkpoint.h"

namespace fs = std::filesystem;
using namespace frugal;

namespace {

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void put(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
  std::cout << path.string() << " (" << bytes.size() << " bytes)\n";
}

Tensor ramp(const Shape& shape, float first) {
  Tensor t = Tensor::zeros(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = first + 0.25f * float(i);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds CORPUS_DIR\n";
    return 2;
  }
  const fs::path corpus = argv[1];
  const fs::path scratch = fuzz::scratch_dir();

  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const fs::path file = scratch / "seed.safetensors";
    write_safetensors(
        file.string(),
        {{"embed", ramp({3, 4}, -1)}, {"norm", ramp({4}, 1)}, {"scalar", ramp({}, 2)}}, dtype,
        {{"format", "pt"}});
    put(corpus / "safetensors_file" / ("three_" + dtype_name(dtype)), slurp(file));
  }

  for (uint32_t vocab : {300u, 70000u}) {
    const fs::path file = scratch / "seed.tok";
    write_token_file(file.string(), {{5, 6, 7}, {8, 9}, {}}, vocab, 1, 2);
    put(corpus / "token_file" / ("vocab_" + std::to_string(vocab)), slurp(file));
  }

  const std::string root = (scratch / "ckpt").string();
  fuzz::save_tiny_checkpoints(root);
  const CheckpointDir dir(root);
  put(corpus / "ckpt_rank_file" / "step_4", slurp(dir.rank_file(4, 0)));
  put(corpus / "ckpt_index" / "step_4", slurp(dir.index_file(4)));
  // Every input odd_files has: each of its 12 paths (kPaths in odd_files.cpp) with each kind.
  for (int path = 0; path < 12; ++path)
    for (size_t kind = 0; kind < test::odd_files().size(); ++kind) {
      std::string name = std::string("path") + char('a' + path) + "_" +
                         test::odd_file_name(test::odd_files()[kind]);
      std::replace(name.begin(), name.end(), ' ', '_');
      put(corpus / "odd_files" / name, std::string{char(path), char(kind)});
    }
  put(corpus / "ckpt_manifest" / "committed",
      '\0' + slurp(fs::path(dir.step_dir(4)) / "COMMITTED"));
  put(corpus / "ckpt_manifest" / "latest", '\1' + slurp(fs::path(root) / "LATEST"));
  // A manifest with every part the manifest target gives values to (ckpt_manifest.cpp).
  nlohmann::json manifest = dir.manifest(4);
  manifest["model"] = llama_config_to_json(LlamaConfig{});
  manifest["config"] = {{"train.lr", "0.001"}, {"train.seed", "7"}};
  manifest["sampler"] = {{"epoch", 1}, {"position", 3}};
  put(corpus / "ckpt_manifest" / "manifest", '\2' + manifest.dump());
  return 0;
}
