// Something other than a regular file where frugal reads one (a FIFO, a directory, a symlink
// loop, /dev/zero through a symlink, a dangling symlink): every reader refuses each by name and
// nothing blocks. Each read runs in a child process with a time limit, so a reader that
// blocks (a FIFO opened with a plain open()) fails its test instead of hanging the suite.
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/checkpoint_index.h"
#include "ckpt/h5_file.h"
#include "ckpt/isolated.h"
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/log.h"
#include "data/corpus.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "model/hf_model.h"
#include "non_regular_files.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;
namespace fs = std::filesystem;

namespace {

// A reader that blocks on a FIFO takes this long to fail its test; a sound one milliseconds.
constexpr double kLimitS = 20;

void copy_dir(const std::string& from, const std::string& to) {
  fs::copy(from, to, fs::copy_options::recursive);
}

const std::string kFixtures = std::string(FRUGAL_SOURCE_DIR) + "/tests/fixtures";

}  // namespace

TEST_CASE("odd files: every reader of a user's file refuses each by name, without blocking",
          "[odd_files]") {
  set_log_quiet(true);
  struct Reader {
    std::string name;
    std::string file;                               // under the directory, replaced
    std::function<void(const std::string&)> setup;  // fills the directory (may be empty)
    std::function<void(const std::string&)> read;   // reads through the directory
  };
  const auto hf_single = [](const std::string& dir) {
    copy_dir(kFixtures + "/hf/gqa_untied", dir);
  };
  const auto hf_sharded = [](const std::string& dir) {
    copy_dir(kFixtures + "/hf/mha_tied_sharded", dir);
  };
  const auto open_hf = [](const std::string& dir) { HfModelDir model(dir); };
  const auto tiny_checkpoint = [](const std::string& dir) {
    Tensor t = Tensor::zeros({3, 2});
    CheckpointDir ckpt(dir);
    ckpt.save_rank(1, 0, {{"model/w", t}}, {{"step", 1}, {"world_size", 1}});
    write_checkpoint_index(ckpt.step_dir(1), 1, {{"model/w", {3, 2}, false}});
  };
  const std::vector<Reader> readers = {
      {"safetensors file", "model.safetensors", [](const std::string&) {},
       [](const std::string& dir) { SafetensorsFile file(dir + "/model.safetensors"); }},
      {"a Hugging Face directory's config.json", "config.json", hf_single, open_hf},
      {"a Hugging Face directory's model.safetensors", "model.safetensors", hf_single, open_hf},
      {"a Hugging Face directory's safetensors index", "model.safetensors.index.json", hf_sharded,
       open_hf},
      {"a Hugging Face directory's shard", "model-00002-of-00002.safetensors", hf_sharded, open_hf},
      {"a token file (opened)", "train.tok", [](const std::string&) {},
       [](const std::string& dir) { TokenFile file(dir + "/train.tok"); }},
      {"a token file (its header)", "train.tok", [](const std::string&) {},
       [](const std::string& dir) { read_token_file_header(dir + "/train.tok"); }},
      {"a corpus file", "corpus.txt", [](const std::string&) {},
       [](const std::string& dir) {
         Corpus corpus;
         read_corpus_file(dir + "/corpus.txt", CorpusFormat::text, corpus);
       }},
      {"a tokenizer.json", "tokenizer.json", [](const std::string&) {},
       [](const std::string& dir) { Tokenizer t(dir + "/tokenizer.json"); }},
      {"a tokenizer.model", "tokenizer.model", [](const std::string&) {},
       [](const std::string& dir) { Tokenizer t(dir + "/tokenizer.model"); }},
      {"the tokenizer_config.json beside a tokenizer.json", "tokenizer_config.json",
       [](const std::string& dir) { copy_dir(kFixtures + "/bpe/llama3", dir); },
       [](const std::string& dir) { Tokenizer t(dir + "/tokenizer.json"); }},
      {"a tokenizer's training text", "text.txt", [](const std::string&) {},
       [](const std::string& dir) {
         train_tokenizer_from_file(dir + "/text.txt", dir + "/out.model", {});
       }},
      {"a checkpoint rank file", "step_00000001/rank_00000.h5", tiny_checkpoint,
       [](const std::string& dir) { H5Reader reader(dir + "/step_00000001/rank_00000.h5"); }},
      {"a checkpoint's index.h5", "step_00000001/index.h5", tiny_checkpoint,
       [](const std::string& dir) { checkpoint_index_sources(dir + "/step_00000001/index.h5"); }},
  };
  for (const Reader& reader : readers)
    for (OddFile kind : odd_files()) {
      INFO(reader.name << ", as a " << odd_file_name(kind));
      TempDir tmp;
      const std::string dir = tmp.file("d");
      fs::create_directories(dir);
      reader.setup(dir);
      const std::string path = dir + "/" + reader.file;
      make_odd_file(path, kind);
      CHECK(refusal_problem([&] { reader.read(dir); }, path,
                            std::string(odd_file_said(kind)) + ", not a regular file",
                            kLimitS) == "");
    }
}
