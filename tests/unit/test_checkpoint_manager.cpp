// The checkpoint manager on one rank: parts' tensors and values round-trip by name, a row shard
// lands in its rows, a replicated tensor comes back whole, and resume falls back past an
// unusable newest step (a damaged file, a part that refuses its values) to the newest usable
// one, or says none can be read.
#include <dlfcn.h>
#include <errno.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.h"
#include "ckpt/checkpoint_index.h"
#include "ckpt/checkpoint_manager.h"
#include "ckpt/step_check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "optim/adamw.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;
namespace fs = std::filesystem;

namespace {

// A part with a [4, 3] tensor (one rank: all its rows), a replicated [2, 2] tensor, and a
// counter in the manifest.
struct FakePart : Stateful {
  Tensor shard = Tensor::zeros({4, 3});
  Tensor shared = Tensor::zeros({2, 2});
  int64_t counter = 0;
  int64_t refuse_counter = -1;  // load_state_values refuses this value
  int loads = 0;

  std::vector<StateTensor> state_tensors() override {
    return {{"fake/shard", shard, whole_rows({4, 3}, false)},
            {"fake/shared", shared, whole_rows({2, 2}, true)}};
  }
  nlohmann::json state_values() const override { return {{"counter", counter}}; }
  void load_state_values(const nlohmann::json& values) override {
    if (values.at("counter").get<int64_t>() == refuse_counter)
      fail("counter ", refuse_counter, " refused");
    counter = values.at("counter").get<int64_t>();
  }
  void after_load() override { ++loads; }

  void set(float base) {
    for (int64_t i = 0; i < shard.numel(); ++i) shard.data<float>()[i] = base + float(i);
    for (int64_t i = 0; i < shared.numel(); ++i) shared.data<float>()[i] = -base - float(i);
    counter = int64_t(base);
  }
};

void expect_values_of(const FakePart& p, float base) {
  for (int64_t i = 0; i < 12; ++i) CHECK(p.shard.data<float>()[i] == base + float(i));
  for (int64_t i = 0; i < 4; ++i) CHECK(p.shared.data<float>()[i] == -base - float(i));
  CHECK(p.counter == int64_t(base));
}

bool one_rank(bool ok) { return ok; }

// Flips one bit of the stored float `value` (its first occurrence in the file): damage inside a
// dataset, which its checksums must catch.
void flip_bit_of(const std::string& path, float value) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&value), sizeof value));
  REQUIRE(at != std::string::npos);
  bytes[at + 1] = char(bytes[at + 1] ^ 0x10);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

TEST_CASE("checkpoint manager: parts' tensors and values round-trip by name", "[ckpt]") {
  TempDir tmp;
  FakePart part;
  CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"fake", &part}}, 2);
  part.set(10);
  manager.save(3);
  part.shard.fill_zero();
  part.shared.fill_zero();
  part.counter = 0;
  manager.load(3);
  expect_values_of(part, 10);
  CHECK(part.loads == 1);
  // What the manifest and the file hold, by the names the parts gave.
  const nlohmann::json manifest = manager.dir().manifest(3);
  CHECK(manifest.at("fake").at("counter") == 10);
  CHECK(manifest.at("world_size") == 1);
  CHECK(manifest.at("format") == "frugal-checkpoint-2");
}

TEST_CASE("checkpoint manager: resume falls back past unusable steps", "[ckpt]") {
  TempDir tmp;
  FakePart part;
  CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"fake", &part}}, 3);
  CHECK(manager.resume() == 0);  // nothing committed: from scratch

  for (int step = 1; step <= 3; ++step) {
    part.set(float(step * 100));
    manager.save(step);
  }
  SECTION("the newest step readable") {
    part.set(0);
    CHECK(manager.resume() == 3);
    expect_values_of(part, 300);
  }
  SECTION("a damaged newest file: the step before it") {
    flip_bit_of(manager.dir().rank_file(3, 0), 305.0f);
    part.set(0);
    CHECK(manager.resume() == 2);
    expect_values_of(part, 200);
  }
  SECTION("a part refusing the newest values: the step before it") {
    part.refuse_counter = 300;
    part.set(0);
    CHECK(manager.resume() == 2);
    expect_values_of(part, 200);
  }
  SECTION("a missing newest file: the step before it") {
    fs::remove(manager.dir().rank_file(3, 0));
    part.set(0);
    CHECK(manager.resume() == 2);
    expect_values_of(part, 200);
  }
  SECTION("none readable: an Error naming each step, the files kept") {
    for (int step = 1; step <= 3; ++step)
      flip_bit_of(manager.dir().rank_file(step, 0), float(step * 100 + 5));
    const std::string error = error_of([&] { manager.resume(); });
    CHECK(contains(error, "no committed checkpoint under"));
    CHECK(contains(error, "step 3:"));
    CHECK(contains(error, "step 1:"));
    CHECK(fs::exists(manager.dir().rank_file(1, 0)));
  }
}

TEST_CASE("checkpoint manager: keep prunes the older committed steps", "[ckpt]") {
  TempDir tmp;
  FakePart part;
  CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"fake", &part}}, 2);
  for (int step = 1; step <= 4; ++step) manager.save(step);
  CHECK(manager.dir().committed_steps() == std::vector<int64_t>{4, 3});
  CHECK(!fs::exists(manager.dir().step_dir(2)));
}

TEST_CASE("AdamW's state: the moments by the names of checkpoint format 2", "[ckpt]") {
  // frugal-checkpoint-2 files name them so; a resume from an older binary's files needs them.
  TrainableShard s{"model.layers.0.mlp.up_proj.weight", Tensor::zeros({3, 2}),
                   Tensor::zeros({3, 2}), Tensor(), RowShard{{7, 2}, 3, 6}};
  AdamW adamw({s}, AdamWConfig{});
  const std::vector<StateTensor> state = adamw.state_tensors();
  REQUIRE(state.size() == 2);
  CHECK(state[0].name == "optim/exp_avg/model.layers.0.mlp.up_proj.weight");
  CHECK(state[1].name == "optim/exp_avg_sq/model.layers.0.mlp.up_proj.weight");
  for (const StateTensor& t : state) {
    CHECK(t.rows.first_row == 3);
    CHECK(t.rows.last_row == 6);
    CHECK(t.rows.full_shape == Shape{7, 2});
    CHECK(!t.rows.replicated);
    CHECK(t.tensor.shape() == Shape{3, 2});
  }
}

namespace {

// Rank `rank` of `ranks`: its padded row shard of a [7, 2] tensor holding 10 * row + column,
// and a replicated [3] tensor.
struct ShardedPart : Stateful {
  int rank, ranks;
  int64_t shard_rows;
  Tensor shard, shared = Tensor::zeros({3});
  ShardedPart(int rank_, int ranks_)
      : rank(rank_),
        ranks(ranks_),
        shard_rows((7 + ranks_ - 1) / ranks_),
        shard(Tensor::zeros({shard_rows, 2})) {}
  RowShard rows() const {
    return {{7, 2},
            std::min<int64_t>(7, rank * shard_rows),
            std::min<int64_t>(7, (rank + 1) * shard_rows)};
  }
  std::vector<StateTensor> state_tensors() override {
    return {{"sharded/w", shard, rows()}, {"sharded/shared", shared, whole_rows({3}, true)}};
  }
  void fill() {
    const RowShard r = rows();
    for (int64_t row = r.first_row; row < r.last_row; ++row)
      for (int64_t col = 0; col < 2; ++col)
        shard.data<float>()[(row - r.first_row) * 2 + col] = float(10 * row + col);
    for (int64_t i = 0; i < 3; ++i) shared.data<float>()[i] = float(100 + i);
  }
};

}  // namespace

// A whole dataset of `numel` floats through the HDF5 library (virtual datasets resolved).
std::vector<float> read_virtual(const std::string& path, const std::string& name, size_t numel) {
  std::vector<float> out(numel, -1.0f);
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  REQUIRE(dataset >= 0);
  const hid_t space = H5Dget_space(dataset);
  CHECK(H5Sget_simple_extent_npoints(space) == hssize_t(numel));
  CHECK(H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0);
  H5Sclose(space);
  H5Dclose(dataset);
  H5Fclose(file);
  return out;
}

TEST_CASE("checkpoint manager: saved by 2 or 3 ranks, loaded by 1, 2 or 3 (resharding)", "[ckpt]") {
  for (int saved_by : {2, 3})
    for (int loaded_by : {1, 2, 3}) {
      TempDir tmp;
      const std::string root = tmp.file("ckpt");
      // The ranks of one process, one after the other: the last to save (rank 0) commits.
      for (int rank = saved_by - 1; rank >= 0; --rank) {
        ShardedPart part(rank, saved_by);
        part.fill();
        CheckpointManager(CheckpointDir(root), rank, saved_by, one_rank, {{"p", &part}}, 2).save(5);
      }
      // index.h5 maps the rank files' rows into whole tensors (read here as h5py would).
      const std::string step_dir = CheckpointDir(root).step_dir(5);
      std::vector<std::string> expected_sources;
      for (int rank = 0; rank < saved_by; ++rank)
        expected_sources.push_back("rank_0000" + std::to_string(rank) + ".h5");
      CHECK(checkpoint_index_sources(step_dir + "/index.h5") == expected_sources);
      const std::vector<float> whole = read_virtual(step_dir + "/index.h5", "sharded/w", 14);
      for (int64_t row = 0; row < 7; ++row)
        for (int64_t col = 0; col < 2; ++col) CHECK(whole[row * 2 + col] == float(10 * row + col));
      CHECK(read_virtual(step_dir + "/index.h5", "sharded/shared", 3) ==
            std::vector<float>{100, 101, 102});
      for (int rank = 0; rank < loaded_by; ++rank) {
        ShardedPart part(rank, loaded_by);
        CheckpointManager(CheckpointDir(root), rank, loaded_by, one_rank, {{"p", &part}}, 2)
            .load(5);
        const RowShard r = part.rows();
        for (int64_t row = r.first_row; row < r.last_row; ++row)
          for (int64_t col = 0; col < 2; ++col)
            CHECK(part.shard.data<float>()[(row - r.first_row) * 2 + col] == float(10 * row + col));
        for (int64_t i = 0; i < 3; ++i) CHECK(part.shared.data<float>()[i] == float(100 + i));
      }
    }
}

TEST_CASE("checkpoint manager: an asynchronous save writes the state of its step", "[ckpt]") {
  TempDir tmp;
  Arena staging("checkpoint staging (test)", Device::cpu);
  FakePart part;
  CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"fake", &part}}, 2,
                            &staging);
  REQUIRE(manager.asynchronous());
  part.set(10);
  manager.save(1);
  // Training goes on at once and changes the live tensors: the file still gets step 1's values.
  part.set(20);
  CHECK(staging.stats().in_use_bytes == (12 + 4) * sizeof(float));
  manager.finish();
  CHECK(!manager.in_flight());
  const auto committed = manager.take_committed();
  REQUIRE(committed);
  CHECK(committed->step == 1);
  CHECK(committed->bytes == (12 + 4) * sizeof(float));
  CHECK(!manager.take_committed());  // once
  CHECK(manager.dir().committed_steps() == std::vector<int64_t>{1});

  // A save while one is in flight waits for it; poll commits the last one once it is written.
  manager.save(2);
  part.set(30);
  manager.save(3);
  CHECK(manager.dir().committed_steps() == std::vector<int64_t>{2, 1});
  while (manager.in_flight()) manager.poll();
  CHECK(manager.dir().committed_steps() == std::vector<int64_t>{3, 2});
  // The staging buffers were reused, not grown.
  CHECK(staging.stats().peak_bytes == (12 + 4) * sizeof(float));
  part.set(0);
  manager.load(2);
  expect_values_of(part, 20);
  manager.load(3);
  expect_values_of(part, 30);
}

TEST_CASE("checkpoint manager: a save in flight when the manager goes is never committed",
          "[ckpt]") {
  TempDir tmp;
  Arena staging("checkpoint staging (test)", Device::cpu);
  FakePart part;
  {
    CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"fake", &part}}, 2,
                              &staging);
    part.set(10);
    manager.save(1);
    manager.finish();
    part.set(20);
    manager.save(2);  // destroyed in flight, as when an error unwinds the run
  }
  CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"fake", &part}}, 2);
  CHECK(manager.dir().committed_steps() == std::vector<int64_t>{1});
  part.set(0);
  CHECK(manager.resume() == 1);
  expect_values_of(part, 10);
}

TEST_CASE("checkpoint manager: committed steps come from their directories, not from LATEST",
          "[ckpt]") {
  TempDir tmp;
  FakePart part;
  CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"fake", &part}}, 3);
  for (int step = 1; step <= 3; ++step) {
    part.set(float(step * 100));
    manager.save(step);
  }
  // A save that died before its commit: rank files without COMMITTED, never resumed.
  part.set(400);
  manager.dir().save_rank(4, 0, {{"fake/shard", part.shard}, {"fake/shared", part.shared}},
                          {{"format", "frugal-checkpoint-2"}, {"step", 4}, {"world_size", 1}});
  const fs::path latest = fs::path(manager.dir().root()) / "LATEST";
  SECTION("LATEST deleted: the newest committed step, and LATEST named missing") {
    fs::remove(latest);
    CHECK(contains(manager.dir().latest_problem(), "LATEST' is missing"));
    part.set(0);
    CHECK(manager.resume() == 3);
    expect_values_of(part, 300);
    CHECK(manager.dir().committed_steps() == std::vector<int64_t>{3, 2, 1});
  }
  SECTION("LATEST empty or garbage: the newest committed step") {
    for (const char* text : {"", "step_0000\x01garbage\n"}) {
      std::ofstream(latest, std::ios::trunc) << text;
      CHECK(contains(manager.dir().latest_problem(), "not a step name"));
      part.set(0);
      CHECK(manager.resume() == 3);
      expect_values_of(part, 300);
    }
  }
  SECTION("the newest step directory deleted: the one before it") {
    fs::remove_all(manager.dir().step_dir(3));
    CHECK(
        contains(manager.dir().latest_problem(), "names step_00000003, which is not a committed"));
    part.set(0);
    CHECK(manager.resume() == 2);
    expect_values_of(part, 200);
  }
  SECTION("LATEST behind the newest committed step (a kill between COMMITTED and LATEST)") {
    std::ofstream(latest, std::ios::trunc) << "step_00000002\n";
    part.set(0);
    CHECK(manager.resume() == 3);
    expect_values_of(part, 300);
  }
}

TEST_CASE("checkpoint manager: a run that does not resume keeps an earlier run's steps aside",
          "[ckpt]") {
  TempDir tmp;
  FakePart part;
  CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"fake", &part}}, 2);
  for (int step = 1; step <= 2; ++step) {
    part.set(float(step * 100));
    manager.save(step);
  }
  const std::string earlier = manager.dir().rank_file(2, 0);
  std::ifstream in(earlier, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  manager.start_afresh();
  CHECK(manager.dir().committed_steps().empty());
  // The new run's steps neither overwrite nor prune the earlier ones.
  for (int step = 1; step <= 3; ++step) {
    part.set(float(step * 1000));
    manager.save(step);
  }
  CHECK(manager.dir().committed_steps() == std::vector<int64_t>{3, 2});
  const fs::path aside =
      fs::path(manager.dir().root()) / "earlier_run_1" / "step_00000002" / "rank_00000.h5";
  std::ifstream kept(aside, std::ios::binary);
  CHECK(std::string((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>()) ==
        bytes);
  CHECK(fs::exists(fs::path(manager.dir().root()) / "earlier_run_1" / "step_00000001"));
  part.set(0);
  CHECK(manager.resume() == 3);
  expect_values_of(part, 3000);
}

TEST_CASE("checkpoint manager: a kill while pruning leaves no half-deleted step", "[ckpt]") {
  // The pruned step is large (many files), so that the kill lands while it is being deleted.
  int half_deleted = 0;
  for (int attempt = 0; attempt < 12; ++attempt) {
    TempDir tmp;
    FakePart part;
    CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"fake", &part}},
                              2);
    for (int step = 1; step <= 2; ++step) manager.save(step);
    const fs::path pruned = manager.dir().step_dir(1);
    constexpr int kFiles = 3000;
    for (int i = 0; i < kFiles; ++i) std::ofstream(pruned / ("extra_" + std::to_string(i)));
    auto files_in = [](const fs::path& dir) {
      int64_t files = 0;
      for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
      return files;
    };
    const int64_t whole = files_in(pruned);  // the extras, the rank file, COMMITTED, index.h5
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      manager.save(3);  // commits 3 and prunes 1
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(2000 + attempt * 2500));
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    // step_00000001 is whole or gone, never half there.
    if (fs::exists(pruned)) half_deleted += files_in(pruned) != whole;
    // Whatever the kill left, the committed steps read back, and the next commit cleans up.
    for (int64_t step : manager.dir().committed_steps())
      CHECK(check_step(manager.dir(), step).ok());
    manager.save(4);
    for (const auto& e : fs::directory_iterator(manager.dir().root()))
      CHECK(e.path().filename().string().rfind(".pruned.", 0) != 0);
  }
  CHECK(half_deleted == 0);
}

TEST_CASE("checkpoint manager: every rank file's manifest is checked, as verify checks it",
          "[ckpt]") {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  for (int step : {4, 5})
    for (int rank = 1; rank >= 0; --rank) {
      ShardedPart part(rank, 2);
      part.fill();
      part.shard.data<float>()[0] += float(step);  // the steps' values differ
      CheckpointManager(CheckpointDir(root), rank, 2, one_rank, {{"p", &part}}, 3).save(step);
    }
  const CheckpointDir dir(root);
  SECTION("a rank file of another step in the newest step's directory") {
    fs::copy_file(dir.rank_file(4, 1), dir.rank_file(5, 1), fs::copy_options::overwrite_existing);
  }
  SECTION("a damaged manifest of rank 1") {
    std::fstream f(dir.rank_file(5, 1), std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t at = bytes.find("\"world_size\":2");
    REQUIRE(at != std::string::npos);
    f.seekp(std::streamoff(at + 13));
    f.put('3');
  }
  // verify refuses step 5 naming rank 1's file, and a resume falls back to step 4.
  const StepCheck check = check_step(dir, 5);
  CHECK(!check.ok());
  CHECK(contains(check.error, dir.rank_file(5, 1)));
  ShardedPart part(0, 1);
  CheckpointManager manager(CheckpointDir(root), 0, 1, one_rank, {{"p", &part}}, 3);
  CHECK(contains(error_of([&] { manager.load(5); }), dir.rank_file(5, 1)));
  CHECK(manager.resume() == 4);
}

// fork() of this test program, made to fail on demand: a large process under strict memory
// overcommit cannot fork.
namespace {
bool g_fail_forks = false;
int g_forks = 0;  // forks made
}  // namespace

extern "C" pid_t fork() {
  if (g_fail_forks) {
    errno = ENOMEM;
    return -1;
  }
  using Fork = pid_t (*)();
  static const Fork real = reinterpret_cast<Fork>(dlsym(RTLD_NEXT, "fork"));
  ++g_forks;
  return real();
}

TEST_CASE("checkpoint manager: one child process reads every file of a resume, and of verify",
          "[ckpt]") {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  for (int step : {3, 4, 5})
    for (int rank = 2; rank >= 0; --rank) {
      ShardedPart part(rank, 3);
      part.fill();
      part.shard.data<float>()[0] += float(step);
      CheckpointManager(CheckpointDir(root), rank, 3, one_rank, {{"p", &part}}, 3).save(step);
    }
  const CheckpointDir dir(root);
  // Rank 1's file of step 5 from step 4: refused, by its manifest's step.
  fs::copy_file(dir.rank_file(4, 1), dir.rank_file(5, 1), fs::copy_options::overwrite_existing);

  // `ckpt verify` of the three steps: nine files, one fork.
  int forks_before = g_forks;
  RankFileChecker checker;
  std::vector<bool> ok;
  for (int64_t step : {3, 4, 5}) {
    const StepCheck check = check_step(checker, dir, step);
    ok.push_back(check.ok());
    CHECK(check.files.size() == 3);
  }
  CHECK(ok == std::vector<bool>{true, true, false});
  CHECK(checker.forks() == 1);
  CHECK(g_forks - forks_before == 1);

  // A resume: step 5's files, then step 4's, read by one child.
  forks_before = g_forks;
  ShardedPart part(0, 1);
  CheckpointManager manager(CheckpointDir(root), 0, 1, one_rank, {{"p", &part}}, 3);
  CHECK(manager.resume() == 4);
  CHECK(g_forks - forks_before == 1);
  // With a checker given, none of its own: the given one's child, already forked, reads them.
  forks_before = g_forks;
  CHECK(manager.resume(INT64_MAX, &checker) == 4);
  CHECK(g_forks == forks_before);
  CHECK(checker.forks() == 1);
}

TEST_CASE("checkpoint manager: resume reads the files here when no child process can be made",
          "[ckpt]") {
  TempDir tmp;
  FakePart part;
  CheckpointManager manager(CheckpointDir(tmp.file("ckpt")), 0, 1, one_rank, {{"fake", &part}}, 2);
  for (int step = 1; step <= 2; ++step) {
    part.set(float(step * 100));
    manager.save(step);
  }
  flip_bit_of(manager.dir().rank_file(2, 0), 205.0f);
  part.set(0);
  g_fail_forks = true;
  int64_t resumed = -1;
  const std::string error = error_of([&] { resumed = manager.resume(); });
  g_fail_forks = false;
  CHECK(error.empty());
  CHECK(resumed == 1);  // the damaged step 2 still refused
  expect_values_of(part, 100);
}
