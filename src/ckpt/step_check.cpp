// A step's rank files read through in a child process (a fork server).
#include "ckpt/step_check.h"

#include <cstdio>

#include "ckpt/h5_file.h"
#include "core/error.h"
#include "core/log.h"

namespace frugal {

namespace {

// The outcome as an error naming the file (the Error's own message already names it).
std::string describe_failure(const std::string& path, const IsolatedOutcome& outcome) {
  if (outcome.crashed)
    return "checkpoint file '" + path + "': damaged: HDF5 " + outcome.text + " reading it";
  if (outcome.timed_out)
    return "checkpoint file '" + path + "': damaged: reading it " + outcome.text;
  return outcome.text;
}

// What the checker's child does with a request: reads the file it names through.
std::string read_rank_file(const std::string& request_text) {
  const nlohmann::json request = nlohmann::json::parse(request_text);
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
  return check;
}

}  // namespace frugal
