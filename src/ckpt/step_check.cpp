// A step's rank files read through in a child process (a fork server).
#include "ckpt/step_check.h"

#include <cstdio>
#include <filesystem>

#include "ckpt/checkpoint_index.h"
#include "ckpt/crc32c.h"
#include "ckpt/h5_file.h"
#include "core/error.h"
#include "core/log.h"
#include "core/regular_file.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

// The outcome as an error naming the file (the Error's own message already names it); `what`
// says what the file is.
std::string describe_failure(const std::string& path, const IsolatedOutcome& outcome,
                             const std::string& what = "checkpoint file") {
  if (outcome.crashed)
    return what + " '" + path + "': damaged: HDF5 " + outcome.text + " reading it";
  if (outcome.timed_out) return what + " '" + path + "': damaged: reading it " + outcome.text;
  if (outcome.ended)
    return what + " '" + path + "': damaged: the process reading it " + outcome.text;
  return outcome.text;
}

// What the checker's child does with a request: reads the file it names through.
std::string read_rank_file(const std::string& request_text) {
  const nlohmann::json request = nlohmann::json::parse(request_text);
  if (request.contains("index")) {
    const std::string path = request.at("index").get<std::string>();
    // The checksum first, then HDF5: the whole file is read before HDF5 is given it.
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", file_crc32c(path, "checkpoint index"));
    return nlohmann::json{{"crc32c", crc}, {"sources", checkpoint_index_sources(path)}}.dump();
  }
  const CheckpointDir dir(request.at("root").get<std::string>());
  const int64_t step = request.at("step").get<int64_t>();
  const int rank = request.at("rank").get<int>();
  if (rank == 0) {
    nlohmann::json manifest;
    CheckpointDir::RankSummary s;
    if (request.at("verify").get<bool>())
      s = dir.verify_rank0(step, manifest);  // one open for the manifest and the tensors
    else
      manifest = dir.manifest(step, 0);
    return nlohmann::json{{"manifest", manifest}, {"tensors", s.tensors}, {"bytes", s.bytes}}
        .dump();
  }
  const CheckpointDir::RankSummary s = dir.verify_rank(step, rank, request.at("manifest"));
  return std::to_string(s.tensors) + " " + std::to_string(s.bytes);
}

}  // namespace

RankFileChecker::RankFileChecker()
    : worker_(read_rank_file, [] { return hdf5_open_objects() == 0; }) {}

// When no child can be made (fork fails with ENOMEM for a large process under strict
// overcommit, say), the file is read in this process, with a warning: a resume must not stop for
// want of the isolation, which only guards against files that would otherwise crash it.
IsolatedOutcome RankFileChecker::read_through(const std::string& path,
                                              const nlohmann::json& request, double time_limit_s) {
  const std::string text = request.dump();
  try {
    return worker_.run(text, time_limit_s);
  } catch (const Error& e) {
    log_warn("cannot read '", path, "' in a child process (", e.what(), "); reading it here");
  }
  IsolatedOutcome outcome;
  try {
    outcome.text = worker_.run_here(text);
    outcome.ok = true;
  } catch (const std::exception& e) {
    outcome.text = e.what();
  }
  return outcome;
}

IsolatedOutcome RankFileChecker::read_rank0(const CheckpointDir& dir, int64_t step, bool verify) {
  const std::string path = dir.rank_file(step, 0);
  return read_through(path, {{"root", dir.root()}, {"step", step}, {"rank", 0}, {"verify", verify}},
                      dir.check_time_limit(path));
}

IsolatedOutcome RankFileChecker::read_rank(const CheckpointDir& dir, int64_t step, int rank,
                                           const nlohmann::json& rank0_manifest) {
  const std::string path = dir.rank_file(step, rank);
  return read_through(
      path, {{"root", dir.root()}, {"step", step}, {"rank", rank}, {"manifest", rank0_manifest}},
      dir.check_time_limit(path));
}

IsolatedOutcome RankFileChecker::read_index(const CheckpointDir& dir, int64_t step) {
  const std::string path = dir.index_file(step);
  return read_through(path, {{"index", path}}, dir.check_time_limit(path));
}

namespace {

// What is wrong with `step`'s index.h5 ("" when it is sound), read in `checker`'s child.
// `world_size`: the step's number of rank files, from rank 0's manifest.
std::string check_index(RankFileChecker& checker, const CheckpointDir& dir, int64_t step,
                        int world_size) {
  const std::string path = dir.index_file(step);
  const IsolatedOutcome read = checker.read_index(dir, step);
  if (!read.ok) return describe_failure(path, read, "checkpoint index");
  const nlohmann::json answer = nlohmann::json::parse(read.text);
  const std::optional<CheckpointDir::CommitMark> mark = dir.commit_mark(step);
  char committed[16] = "";
  if (mark && mark->index_crc32c)
    std::snprintf(committed, sizeof committed, "%08x", *mark->index_crc32c);
  const std::string crc = answer.at("crc32c").get<std::string>();
  if (committed[0] && crc != committed)
    return "checkpoint index '" + path + "': damaged: its CRC32C is " + crc + ", COMMITTED says " +
           committed;
  std::string missing;
  for (const auto& source : answer.at("sources")) {
    const std::string name = source.get<std::string>();
    int rank = -1;
    for (int r = 0; r < world_size && rank < 0; ++r)
      if (fs::path(dir.rank_file(step, r)).filename() == name) rank = r;
    if (rank < 0)
      return "checkpoint index '" + path + "': damaged: it reads '" + printable(name) +
             "', which is not one of the step's " + std::to_string(world_size) + " rank files";
    if (!non_regular_kind(dir.rank_file(step, rank)).empty()) missing += " " + name;
  }
  if (!missing.empty()) return "checkpoint index '" + path + "': reads missing files:" + missing;
  return "";
}

}  // namespace

StepCheck check_step(const CheckpointDir& dir, int64_t step, int first, int stride) {
  RankFileChecker checker;
  return check_step(checker, dir, step, first, stride);
}

StepCheck check_step(RankFileChecker& checker, const CheckpointDir& dir, int64_t step, int first,
                     int stride) {
  FRUGAL_CHECK(stride >= 1 && first >= 0, "check_step of ranks ", first, " + k * ", stride);
  StepCheck check;
  check.step = step;
  // Rank 0's file first: its manifest is what the others must agree with. When it is among the
  // files to check, one request reads it through and answers its manifest too.
  const std::string first_file = dir.rank_file(step, 0);
  const bool check_first = first == 0;
  const IsolatedOutcome opened = checker.read_rank0(dir, step, check_first);
  if (!opened.ok) {
    check.error = describe_failure(first_file, opened);
    if (check_first) check.files.push_back({0, first_file, check.error, 0, 0});
    return check;
  }
  const nlohmann::json answer = nlohmann::json::parse(opened.text);
  check.manifest = answer.at("manifest");
  if (check_first)
    check.files.push_back({0, first_file, "", answer.at("tensors").get<int64_t>(),
                           answer.at("bytes").get<int64_t>()});
  try {
    check.world_size = manifest_world_size(first_file, check.manifest);
  } catch (const Error& e) {
    check.error = e.what();
    return check;
  }
  const std::optional<int> committed = dir.committed_world_size(step);
  if (committed && *committed != check.world_size) {
    check.error = "checkpoint step " + std::to_string(step) + ": its COMMITTED file names " +
                  std::to_string(*committed) + " rank files, rank 0's manifest " +
                  std::to_string(check.world_size);
    return check;
  }
  for (int rank = check_first ? stride : first; rank < check.world_size; rank += stride) {
    RankFileCheck file;
    file.rank = rank;
    file.path = dir.rank_file(step, rank);
    const IsolatedOutcome read = checker.read_rank(dir, step, rank, check.manifest);
    if (read.ok) {
      long long tensors = 0, bytes = 0;
      std::sscanf(read.text.c_str(), "%lld %lld", &tensors, &bytes);
      file.tensors = tensors;
      file.bytes = bytes;
    } else {
      file.error = describe_failure(file.path, read);
      if (check.error.empty()) check.error = file.error;
    }
    check.files.push_back(file);
  }
  // index.h5 with rank 0's share, once the rank files it maps are known sound. A step
  // committed with its checksum must have it; one committed before (or before index.h5
  // existed) may not.
  const std::optional<CheckpointDir::CommitMark> mark = dir.commit_mark(step);
  const bool index_expected = mark && mark->index_crc32c;
  std::error_code ec;
  const bool index_present =
      fs::symlink_status(dir.index_file(step), ec).type() != fs::file_type::not_found;
  if (check_first && check.ok() && (index_present || index_expected)) {
    check.index_checked = true;
    check.index_error = index_present ? check_index(checker, dir, step, check.world_size)
                                      : "checkpoint index '" + dir.index_file(step) +
                                            "' is missing (its step was committed with one)";
    check.error = check.index_error;
  }
  return check;
}

}  // namespace frugal
