// A step's rank files read through in child processes.
#include "ckpt/step_check.h"

#include <cstdio>
#include <functional>

#include "ckpt/isolated.h"
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

// Reads `path` through with `work` in a child process. When no child can be made (fork fails
// with ENOMEM for a large process under strict overcommit, say), in this process, with a
// warning: a resume must not stop for want of the isolation, which only guards against files
// that would otherwise crash it.
IsolatedOutcome read_through(const std::string& path, const std::function<std::string()>& work,
                             double time_limit_s) {
  try {
    return run_isolated(work, time_limit_s);
  } catch (const Error& e) {
    log_warn("cannot read '", path, "' in a child process (", e.what(), "); reading it here");
  }
  IsolatedOutcome outcome;
  try {
    outcome.text = work();
    outcome.ok = true;
  } catch (const std::exception& e) {
    outcome.text = e.what();
  }
  return outcome;
}

}  // namespace

StepCheck check_step(const CheckpointDir& dir, int64_t step, int first, int stride) {
  FRUGAL_CHECK(stride >= 1 && first >= 0, "check_step of ranks ", first, " + k * ", stride);
  StepCheck check;
  check.step = step;
  // Rank 0's file first: its manifest is what the others must agree with. When it is among the
  // files to check, one child reads it through and answers its manifest too.
  const std::string first_file = dir.rank_file(step, 0);
  const bool check_first = first == 0;
  const IsolatedOutcome opened = read_through(
      first_file,
      [&] {
        const nlohmann::json manifest = dir.manifest(step, 0);
        CheckpointDir::RankSummary s;
        if (check_first) s = dir.verify_rank(step, 0, manifest);
        return nlohmann::json{{"manifest", manifest}, {"tensors", s.tensors}, {"bytes", s.bytes}}
            .dump();
      },
      dir.check_time_limit(first_file));
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
    const IsolatedOutcome read = read_through(
        file.path,
        [&] {
          const CheckpointDir::RankSummary s = dir.verify_rank(step, rank, check.manifest);
          return std::to_string(s.tensors) + " " + std::to_string(s.bytes);
        },
        dir.check_time_limit(file.path));
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
