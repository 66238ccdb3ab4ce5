// `frugal ckpt ls|verify RUN_DIR`: what a run's checkpoints hold, and whether every byte of
// them still reads back (checksums), without starting a run.
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/options.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/step_check.h"
#include "core/error.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace frugal {

namespace {

// A run directory or its ckpt/ directory.
fs::path checkpoint_root(const std::string& path) {
  const fs::path p(path);
  if (CheckpointDir::holds_checkpoints(p.string())) return p;
  if (CheckpointDir::holds_checkpoints((p / "ckpt").string())) return p / "ckpt";
  fail("ckpt: '", path, "' holds no committed checkpoint (no LATEST or step directory in it or ",
       "in its ckpt/)");
}

// Reads every tensor of every rank file of `step` back (Fletcher32, CRC32C), and checks that
// the rank files agree with rank 0's manifest; each file in a child process, so a file that
// makes HDF5 crash is reported as damaged and the other files and steps are still verified.
// `checker`'s one child reads the files of every step (another only after a crash or a hang).
nlohmann::ordered_json verify_step(RankFileChecker& checker, const CheckpointDir& dir,
                                   int64_t step) {
  const StepCheck check = check_step(checker, dir, step);
  nlohmann::ordered_json report = {{"step", step}, {"ok", check.ok()}};
  if (check.world_size > 0) report["world_size"] = check.world_size;
  if (!check.ok()) report["error"] = check.error;
  int64_t tensors = 0, bytes = 0;
  nlohmann::json damaged = nlohmann::json::array();
  for (const RankFileCheck& f : check.files) {
    tensors += f.tensors;
    bytes += f.bytes;
    if (!f.error.empty()) damaged.push_back(f.path);
  }
  // index.h5 (its checksum, and the rank files its virtual datasets read, which HDF5 would
  // read as zeros were one missing), read in the checker's child like the rank files.
  if (check.index_checked) {
    report["index"] = check.index_error.empty() ? "ok" : check.index_error;
    if (!check.index_error.empty()) damaged.push_back(dir.index_file(step));
  }
  if (!damaged.empty()) report["damaged_files"] = damaged;
  report["tensors"] = tensors;
  report["bytes"] = bytes;
  return report;
}

// Step directories that are not committed (a save being written, or one whose writer was
// stopped before every rank's file was on disk), with their temporary files: one JSON line each.
std::vector<nlohmann::ordered_json> uncommitted_steps(const CheckpointDir& dir,
                                                      const std::vector<int64_t>& known) {
  std::vector<nlohmann::ordered_json> lines;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir.root(), ec)) {
    long long step = -1;
    const std::string name = entry.path().filename().string();
    // With error codes: an entry that cannot be looked at (a symlink loop) is not a directory.
    if (!entry.is_directory(ec) || std::sscanf(name.c_str(), "step_%lld", &step) != 1 ||
        name != fs::path(dir.step_dir(step)).filename().string() ||
        std::find(known.begin(), known.end(), step) != known.end())
      continue;
    int64_t temporary = 0, files = 0;
    for (const auto& f : fs::directory_iterator(entry.path(), ec)) {
      files += f.is_regular_file(ec);
      temporary += f.path().extension() == ".tmp";
    }
    lines.push_back({{"step", step},
                     {"committed", false},
                     {"files", files},
                     {"temporary_files", temporary},
                     {"note",
                      "a save still being written, or abandoned by a writer that stopped "
                      "(not used by resume; the next run removes its temporary files)"}});
  }
  std::sort(lines.begin(), lines.end(),
            [](const auto& a, const auto& b) { return a["step"] > b["step"]; });
  return lines;
}

// Temporary files outside the uncommitted step directories: a LATEST.tmp (or a COMMITTED.tmp
// of a step since found committed) whose writer was killed between writing it and renaming
// it. One JSON line each, so that ls accounts for every temporary file the next run removes.
std::vector<nlohmann::ordered_json> stray_temporary_files(
    const CheckpointDir& dir, const std::vector<nlohmann::ordered_json>& uncommitted) {
  std::vector<nlohmann::ordered_json> lines;
  for (const std::string& file : dir.temporary_files()) {
    const fs::path parent = fs::path(file).parent_path();
    const bool in_uncommitted =
        std::any_of(uncommitted.begin(), uncommitted.end(), [&](const auto& line) {
          return parent == fs::path(dir.step_dir(line["step"].template get<int64_t>()));
        });
    if (!in_uncommitted)
      lines.push_back({{"temporary_file", file},
                       {"note",
                        "left by a writer that stopped before renaming it (not used by resume; "
                        "the next run removes it)"}});
  }
  return lines;
}

}  // namespace

int cmd_ckpt(const std::vector<std::string>& args) {
  std::string action, path;
  int64_t only_step = -1;
  double time_limit_s = 0;
  po::options_description named("options");
  named.add_options()("help,h", "print this help and exit")(
      "step", po::value<int64_t>(&only_step)->value_name("N"),
      "only this step (default: every committed step)")(
      "time-limit", po::value<double>(&time_limit_s)->value_name("S"),
      "verify: seconds a rank file may take to read before it counts as damaged (it makes HDF5 "
      "hang; default: 60 plus 1 per 20 MB)");
  po::options_description hidden;
  hidden.add_options()("action", po::value<std::string>(&action))("path",
                                                                  po::value<std::string>(&path));
  po::options_description all;
  all.add(named).add(hidden);
  po::positional_options_description positional;
  positional.add("action", 1).add("path", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    fail("ckpt: ", program_options_message(e), " (see 'frugal ckpt --help')");
  }
  if (vm.count("help") || action.empty()) {
    std::cout
        << "usage: frugal ckpt ls RUN_DIR       the committed steps, newest first (and any step\n"
           "                                    not committed: a save being written, or\n"
           "                                    abandoned, and any temporary file left)\n"
           "       frugal ckpt verify RUN_DIR   read every tensor of every rank file back,\n"
           "                                    checking its checksums; exit 1 on damage\n\n"
           "RUN_DIR is a run's out_dir or its ckpt/ directory. One JSON line per step.\n\n"
        << named << "\n";
    return vm.count("help") ? 0 : 2;
  }
  if (action != "ls" && action != "verify")
    fail("ckpt: unknown action '", action, "'; expected ls or verify");
  if (path.empty()) fail("ckpt: ", action, " needs a run directory");
  if (!(time_limit_s >= 0)) fail("ckpt: --time-limit ", time_limit_s, " is not a number of seconds");
  if (vm.count("step") && only_step < 0) fail("ckpt: --step ", only_step, " is negative");
  CheckpointDir dir(checkpoint_root(path).string());
  dir.set_check_time_limit(time_limit_s);
  std::vector<int64_t> steps = dir.committed_steps();
  // Committed once, damaged since (a rank file deleted): verify reports them too.
  std::map<int64_t, std::string> incomplete;
  if (action == "verify")
    for (const auto& [step, problem] : dir.incomplete_steps()) {
      incomplete[step] = problem;
      steps.push_back(step);
    }
  std::sort(steps.rbegin(), steps.rend());
  if (only_step >= 0) {
    if (std::find(steps.begin(), steps.end(), only_step) == steps.end())
      fail("ckpt: step ", only_step, " is not a committed step of '", path, "'");
    steps = {only_step};
  }
  const int64_t latest = dir.latest().value_or(-1);
  const std::string pointer = dir.latest_problem();
  if (!pointer.empty())
    std::cerr << "frugal: warning: " << pointer << "; the committed steps are found from their "
              << "directories\n";
  // ls lists; verify reports these as damaged steps below.
  if (action == "ls")
    for (const auto& [step, problem] : dir.incomplete_steps())
      std::cerr << "frugal: warning: checkpoint step " << step << " is unusable: " << problem
                << "\n";
  bool all_ok = true;
  if (only_step < 0) {
    std::vector<int64_t> known = dir.committed_steps();
    for (const auto& [step, problem] : dir.incomplete_steps()) known.push_back(step);
    const std::vector<nlohmann::ordered_json> uncommitted = uncommitted_steps(dir, known);
    for (const nlohmann::ordered_json& line : uncommitted) std::cout << line.dump() << std::endl;
    for (const nlohmann::ordered_json& line : stray_temporary_files(dir, uncommitted))
      std::cout << line.dump() << std::endl;
  }
  RankFileChecker checker;
  for (int64_t step : steps) {
    nlohmann::ordered_json line;
    if (action == "verify" && incomplete.count(step)) {
      line = {{"step", step}, {"ok", false}, {"error", incomplete[step]}};
      all_ok = false;
    } else if (action == "verify") {
      line = verify_step(checker, dir, step);
      all_ok = all_ok && line["ok"].get<bool>();
    } else {
      int64_t disk = 0;
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(dir.step_dir(step), ec))
        if (entry.is_regular_file(ec)) {
          const auto bytes = entry.file_size(ec);
          if (!ec) disk += int64_t(bytes);
        }
      line = {{"step", step}, {"dir", dir.step_dir(step)}, {"disk_bytes", disk}};
    }
    line["latest"] = step == latest;
    std::cout << line.dump() << std::endl;
  }
  return all_ok ? 0 : 1;
}

}  // namespace frugal
