// Something other than a regular file where frugal reads one (a FIFO, a directory, a symlink
// loop, /dev/zero through a symlink, a dangling symlink): every reader refuses each by name and
// nothing blocks; in a checkpoint, verify's check names the damaged file and resume falls back
// to the intact step. Each read runs in a child process with a time limit, so a reader that
// blocks (a FIFO opened with a plain open()) fails its test instead of hanging the suite.
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/checkpoint_index.h"
#include "ckpt/checkpoint_manager.h"
#include "ckpt/crc32c.h"
#include "ckpt/h5_file.h"
#include "ckpt/isolated.h"
#include "ckpt/safetensors.h"
#include "ckpt/step_check.h"
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

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

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
         read_corpus_file(dir + "/corpus.txt", {.format = CorpusFormat::text}, corpus);
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

namespace {

// A part of one [4, 3] tensor and a counter, saved at steps 2 and 3 (values 200, 300).
struct TwoSteps : Stateful {
  Tensor values = Tensor::zeros({4, 3});
  int64_t counter = 0;
  std::vector<StateTensor> state_tensors() override {
    return {{"part/values", values, whole_rows({4, 3}, false)}};
  }
  nlohmann::json state_values() const override { return {{"counter", counter}}; }
  void load_state_values(const nlohmann::json& v) override {
    counter = v.at("counter").get<int64_t>();
  }
  void set(int64_t base) {
    for (int64_t i = 0; i < values.numel(); ++i) values.data<float>()[i] = float(base + i);
    counter = base;
  }
  bool holds(int64_t base) const {
    for (int64_t i = 0; i < values.numel(); ++i)
      if (values.data<float>()[i] != float(base + i)) return false;
    return counter == base;
  }
};

CheckpointManager manager_of(const std::string& root, TwoSteps& part) {
  return CheckpointManager(
      CheckpointDir(root), 0, 1, [](bool ok) { return ok; }, {{"part", &part}}, 10);
}

void save_two_steps(const std::string& root) {
  TwoSteps part;
  CheckpointManager manager = manager_of(root, part);
  for (int64_t step : {2, 3}) {
    part.set(step * 100);
    manager.save(step);
  }
}

// A resume of `root` in a child process: "resumed N" (after checking the values are step N's
// exactly), or why it failed.
std::string resume_in_child(const std::string& root) {
  const IsolatedOutcome outcome = run_isolated(
      [&] {
        TwoSteps part;
        CheckpointManager manager = manager_of(root, part);
        const int64_t step = manager.resume();
        if (step > 0 && !part.holds(step * 100)) fail("step ", step, " resumed with other values");
        return "resumed " + std::to_string(step);
      },
      kLimitS);
  return outcome.ok ? outcome.text : "failed: " + outcome.text;
}

// After a resume of `root`, the run saves step 3 again (new values) and a resume then takes it:
// what is in the way of that save (a directory where a file goes, a step's name on a symlink
// loop) is moved aside, never a reason for the save to fail. "resaved", or what failed.
std::string resave_in_child(const std::string& root) {
  const IsolatedOutcome outcome = run_isolated(
      [&] {
        {
          TwoSteps part;
          CheckpointManager manager = manager_of(root, part);
          manager.resume();
          part.set(333);
          manager.save(3);
        }
        TwoSteps part;
        CheckpointManager manager = manager_of(root, part);
        const int64_t step = manager.resume();
        if (step != 3 || !part.holds(333))
          fail("resumed step ", step, ", not the step 3 saved again");
        return std::string("resaved");
      },
      kLimitS);
  return outcome.ok ? outcome.text : "failed: " + outcome.text;
}

// What `ckpt verify`'s check says of `step`, in a child process: its error ("" when sound).
std::string check_in_child(const std::string& root, int64_t step) {
  const IsolatedOutcome outcome = run_isolated(
      [&] {
        const CheckpointDir dir(root);
        std::string said = check_step(dir, step).error;
        for (const auto& [s, problem] : dir.incomplete_steps())
          if (s == step) said += problem;
        return said;
      },
      kLimitS);
  return outcome.ok ? outcome.text : "failed: " + outcome.text;
}

std::string latest_problem_in_child(const std::string& root) {
  const IsolatedOutcome outcome =
      run_isolated([&] { return CheckpointDir(root).latest_problem(); }, kLimitS);
  return outcome.ok ? outcome.text : "failed: " + outcome.text;
}

}  // namespace

TEST_CASE("odd files in a checkpoint: named by verify's check, resume falls back", "[odd_files]") {
  set_log_quiet(true);
  for (OddFile kind : odd_files()) {
    const std::string said = odd_file_said(kind);
    TempDir tmp;
    const std::string root = tmp.file("ckpt");
    save_two_steps(root);
    const CheckpointDir dir(root);
    SECTION(std::string("LATEST as a ") + odd_file_name(kind) + ": named, and the newest step") {
      const std::string latest = root + "/LATEST";
      make_odd_file(latest, kind);
      const std::string problem = latest_problem_in_child(root);
      CHECK(contains(problem, latest));
      CHECK(contains(problem, said));
      CHECK(resume_in_child(root) == "resumed 3");
      CHECK(resave_in_child(root) == "resaved");
    }
    SECTION(std::string("a rank file as a ") + odd_file_name(kind) + ": named, the older step") {
      const std::string file = dir.rank_file(3, 0);
      make_odd_file(file, kind);
      const std::string problem = check_in_child(root, 3);
      CHECK(contains(problem, file));
      CHECK(contains(problem, said));
      CHECK(resume_in_child(root) == "resumed 2");
      CHECK(resave_in_child(root) == "resaved");
    }
    SECTION(std::string("index.h5 as a ") + odd_file_name(kind) + ": named, the older step") {
      const std::string file = dir.step_dir(3) + "/index.h5";
      make_odd_file(file, kind);
      const std::string problem = check_in_child(root, 3);
      CHECK(contains(problem, file));
      CHECK(contains(problem, said));
      CHECK(resume_in_child(root) == "resumed 2");
      CHECK(resave_in_child(root) == "resaved");
    }
    SECTION(std::string("COMMITTED as a ") + odd_file_name(kind) + ": nothing blocks") {
      // A step without a readable COMMITTED counts as one saved before COMMITTED existed:
      // committed when LATEST has reached it, as LATEST has here; its files are sound.
      make_odd_file(dir.step_dir(3) + "/COMMITTED", kind);
      CHECK(check_in_child(root, 3) == "");
      CHECK(resume_in_child(root) == "resumed 3");
      CHECK(resave_in_child(root) == "resaved");
    }
    if (kind != OddFile::directory) {  // an empty step directory is an uncommitted save
      SECTION(std::string("the step directory as a ") + odd_file_name(kind) +
              ": named, the older step") {
        make_odd_file(dir.step_dir(3), kind);
        const std::string problem = check_in_child(root, 3);
        CHECK(contains(problem, dir.step_dir(3)));
        CHECK(contains(problem, said));
        CHECK(resume_in_child(root) == "resumed 2");
        CHECK(resave_in_child(root) == "resaved");
      }
      SECTION(std::string("the checkpoint directory as a ") + odd_file_name(kind) +
              ": named, not a fresh start") {
        make_odd_file(root, kind);
        const std::string resumed = resume_in_child(root);
        CHECK(contains(resumed, "failed: "));
        CHECK(contains(resumed, root));
        CHECK(contains(resumed, said));
      }
    }
    SECTION(std::string("a ") + odd_file_name(kind) + " elsewhere in the directory: ignored") {
      make_odd_file(root + "/stray", kind);
      make_odd_file(dir.step_dir(3) + "/stray", kind);
      CHECK(check_in_child(root, 3) == "");
      CHECK(resume_in_child(root) == "resumed 3");
    }
  }
}

TEST_CASE("index.h5: its CRC32C in COMMITTED; a damaged one makes its step unusable",
          "[odd_files]") {
  set_log_quiet(true);
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  save_two_steps(root);
  const CheckpointDir dir(root);
  const std::string index = dir.step_dir(3) + "/index.h5";
  const std::string committed = dir.step_dir(3) + "/COMMITTED";
  // The checksum of the bytes on disk, computed here from the file.
  const std::string bytes = slurp(index);
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", crc32c(bytes.data(), bytes.size()));
  nlohmann::json mark = nlohmann::json::parse(slurp(committed));
  REQUIRE(mark.contains("index_crc32c"));
  CHECK(mark.at("index_crc32c") == crc);
  CHECK(check_in_child(root, 3) == "");

  SECTION("one flipped bit anywhere: the checksum names it, resume takes the older step") {
    for (size_t at : {size_t(0), bytes.size() / 3, bytes.size() / 2, bytes.size() - 1}) {
      std::string flipped = bytes;
      flipped[at] = char(flipped[at] ^ 0x20);
      std::ofstream(index, std::ios::binary | std::ios::trunc) << flipped;
      const std::string problem = check_in_child(root, 3);
      INFO("byte " << at << ": " << problem);
      CHECK(contains(problem, index));
      CHECK(contains(problem, "damaged"));
      CHECK(resume_in_child(root) == "resumed 2");
    }
  }
  SECTION("committed before the checksum: HDF5's reading in the child names a damaged one") {
    mark.erase("index_crc32c");
    std::ofstream(committed, std::ios::trunc) << mark.dump() << "\n";
    CHECK(check_in_child(root, 3) == "");
    std::ofstream(index, std::ios::binary | std::ios::trunc) << bytes.substr(0, 600);
    const std::string problem = check_in_child(root, 3);
    CHECK(contains(problem, index));
    CHECK(contains(problem, "damaged"));
    CHECK(resume_in_child(root) == "resumed 2");
  }
  SECTION("deleted from a step committed with its checksum: named") {
    fs::remove(index);
    const std::string problem = check_in_child(root, 3);
    CHECK(contains(problem, index));
    CHECK(contains(problem, "missing"));
    CHECK(resume_in_child(root) == "resumed 2");
  }
}

TEST_CASE("odd files in a checkpoint: a save's temporary files are found past symlink loops",
          "[odd_files]") {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  save_two_steps(root);
  const CheckpointDir dir(root);
  // Twenty loops at each level: whatever order the walk takes, some come before the .tmp file.
  for (int i = 0; i < 20; ++i) {
    make_odd_file(root + "/loop" + std::to_string(i), OddFile::symlink_loop);
    make_odd_file(dir.step_dir(3) + "/loop" + std::to_string(i), OddFile::symlink_loop);
  }
  const std::string abandoned = dir.step_dir(3) + "/rank_00001.h5.tmp";
  std::ofstream(abandoned) << "half a file";
  CHECK(dir.temporary_files() == std::vector<std::string>{abandoned});
}
