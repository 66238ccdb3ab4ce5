// Step directories, commit markers (COMMITTED, then LATEST), pruning by rename, and the
// checked opening of rank files (manifest checksum and agreement with rank 0).
#include "ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "ckpt/crc32c.h"
#include "ckpt/h5_file.h"
#include "core/error.h"
#include "core/json_integer.h"
#include "core/log.h"
#include "core/regular_file.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

constexpr const char* kManifest = "manifest";
// The manifest is an attribute, outside the datasets' Fletcher32 and CRC32C: it gets its own.
constexpr const char* kManifestCrc = "manifest_crc32c";
constexpr const char* kCommitted = "COMMITTED";
constexpr const char* kLatest = "LATEST";
// What a prune renames a step directory to before deleting it (".pruned.step_00000100").
constexpr const char* kPrunedPrefix = ".pruned.";

// A CRC32C as the eight hex digits frugal stores.
std::string hex_crc(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

std::string crc_text(const std::string& text) { return hex_crc(crc32c(text.data(), text.size())); }

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

// The step of a directory name "step_<digits>", else nullopt.
std::optional<int64_t> step_of_name(const std::string& name) {
  if (name.size() <= 5 || name.size() > 5 + 18 || name.rfind("step_", 0) != 0) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// Whether anything is at `path`, a symlink loop or a dangling symlink included.
bool something_at(const fs::path& path) {
  std::error_code ec;
  return fs::symlink_status(path, ec).type() != fs::file_type::not_found && !ec;
}

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// "<path>.unusable", or with ".2", ".3", ... the first name that is free.
std::string free_unusable_name(const std::string& path) {
  std::string name = path + ".unusable";
  for (int n = 2; something_at(name); ++n) name = path + ".unusable." + std::to_string(n);
  return name;
}

// Writes `text` to path atomically: a temporary file, fsync, rename, fsync of the directory.
void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) fail("cannot write '", tmp.string(), "'");
  }
  fsync_path(tmp, false);
  move_directory_aside(path.string());
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("cannot rename '", tmp.string(), "' to '", path.string(), "': ", ec.message());
  fsync_path(path.parent_path(), true);
}

// The start of a marker file (LATEST, COMMITTED): a line, so a huge one is damage, not
// something to read whole. An Error naming it when it is not a regular file (a FIFO there
// would block a plain open forever).
std::string read_small_file(const fs::path& path, const std::string& what) {
  return RegularFile(path.string(), what).read_prefix(256);
}

// What LATEST holds: the step it names, or why it names none (problem; "" when absent).
struct Pointer {
  bool exists = false;
  std::optional<int64_t> step;
  std::string problem;
};

Pointer read_pointer(const fs::path& root) {
  Pointer p;
  const fs::path path = root / kLatest;
  p.exists = something_at(path);
  if (!p.exists) return p;
  std::string text;
  try {
    text = read_small_file(path, "checkpoint pointer");
  } catch (const Error& e) {
    p.problem = e.what();
    return p;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  p.step = step_of_name(text);
  if (!p.step) {
    std::string shown;
    for (char c : text.substr(0, 40)) shown += (c >= 32 && c < 127) ? c : '?';
    p.problem =
        "'" + path.string() + "' holds '" + shown + "', not a step name such as step_00000100";
  }
  return p;
}

nlohmann::json read_manifest(const H5Reader& reader) {
  const std::string text = reader.attribute(kManifest);
  const bool has_crc = reader.has_attribute(kManifestCrc);
  if (has_crc && reader.attribute(kManifestCrc) != crc_text(text))
    fail("checkpoint file '", reader.path(), "': manifest checksum mismatch (the file is corrupt)");
  const nlohmann::json manifest = parse_manifest(reader.path(), text);
  // Version 1 files predate the manifest checksum; every later one must carry it.
  if (!has_crc && manifest.value("format", std::string()) != "frugal-checkpoint-1")
    fail("checkpoint file '", reader.path(), "': manifest has no checksum");
  return manifest;
}

}  // namespace

std::string move_directory_aside(const std::string& path) {
  std::error_code ec;
  if (fs::symlink_status(path, ec).type() != fs::file_type::directory) return "";
  const std::string aside = free_unusable_name(path);
  fs::rename(path, aside, ec);
  if (ec)
    fail("'", path, "' is a directory where a checkpoint file belongs, and cannot be moved aside: ",
         ec.message());
  log_warn("checkpoint: '", path, "' was a directory where a checkpoint file belongs: moved to '",
           aside, "'");
  return aside;
}

nlohmann::json parse_manifest(const std::string& path, const std::string& text) {
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint file '", path, "': manifest is not valid JSON: ", e.what());
  }
  if (!manifest.is_object()) fail("checkpoint file '", path, "': manifest is not a JSON object");
  return manifest;
}

int manifest_world_size(const std::string& path, const nlohmann::json& manifest) {
  const nlohmann::json world = manifest.value("world_size", nlohmann::json());
  if (!world.is_number_integer() || world.get<int64_t>() < 1 || world.get<int64_t>() > (1 << 24))
    fail("checkpoint file '", path, "': its manifest has world_size ", world.dump(),
         ", not a number of ranks");
  return world.get<int>();
}

void check_manifest_agrees(const std::string& path, const nlohmann::json& manifest,
                           const nlohmann::json& rank0, int64_t step, int rank) {
  const nlohmann::json saved_step = manifest.value("step", nlohmann::json());
  if (saved_step != nlohmann::json(step))
    fail("checkpoint file '", path, "': its manifest is of step ", saved_step.dump(),
         ", not of its directory's step ", step);
  if (manifest.contains("rank") && manifest.at("rank") != nlohmann::json(rank))
    fail("checkpoint file '", path, "': its manifest is of rank ", manifest.at("rank").dump(),
         ", not ", rank);
  const nlohmann::json world = manifest.value("world_size", nlohmann::json());
  if (!world.is_number_integer() || world.get<int64_t>() <= rank)
    fail("checkpoint file '", path, "': its manifest has world_size ", world.dump(),
         ", which has no rank ", rank);
  for (const auto& [key, value] : rank0.items())
    if (key != "rank" && (!manifest.contains(key) || manifest.at(key) != value))
      fail("checkpoint file '", path, "': its manifest disagrees with rank 0's on '", key, "'");
  for (const auto& [key, value] : manifest.items())
    if (key != "rank" && !rank0.contains(key))
      fail("checkpoint file '", path, "': its manifest has '", key, "', which rank 0's has not");
}

bool CheckpointDir::holds_checkpoints(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kLatest, ec)) return true;
  if (!fs::is_directory(path, ec)) return false;
  for (const auto& entry : fs::directory_iterator(path, ec))
    if (step_of_name(entry.path().filename().string()) && entry.is_directory(ec)) return true;
  return false;
}

double CheckpointDir::check_time_limit(const std::string& rank_file) const {
  if (check_time_limit_s_ > 0) return check_time_limit_s_;
  std::error_code ec;
  const auto bytes = fs::file_size(rank_file, ec);
  return 60.0 + (ec ? 0.0 : double(bytes) / 20e6);
}

std::string CheckpointDir::step_dir(int64_t step) const {
  return (fs::path(root_) / step_name(step)).string();
}

std::string CheckpointDir::rank_file(int64_t step, int rank) const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.h5", rank);
  return (fs::path(step_dir(step)) / buf).string();
}

void CheckpointDir::save_rank(int64_t step, int rank, const std::vector<NamedTensor>& tensors,
                              const nlohmann::json& manifest) const {
  std::error_code ec;
  fs::create_directories(step_dir(step), ec);
  if (ec) fail("cannot create checkpoint directory '", step_dir(step), "': ", ec.message());
  H5Writer writer(rank_file(step, rank));
  for (const NamedTensor& t : tensors) writer.write_tensor(t.name, t.tensor);
  const std::string text = manifest.dump();
  writer.write_attribute(kManifest, text);
  writer.write_attribute(kManifestCrc, crc_text(text));
  move_directory_aside(rank_file(step, rank));  // only this rank writes this name
  writer.close();
}

void CheckpointDir::commit(int64_t step, int world_size, int64_t keep) const {
  nlohmann::json mark{{"step", step}, {"world_size", world_size}};
  // index.h5 is read by h5py and h5dump, not by frugal's loads: its checksum is what lets
  // `ckpt verify` and resume tell a damaged one (a mapping moved by a flipped bit reads other
  // rows, silently) from a sound one.
  if (something_at(index_file(step)))
    mark["index_crc32c"] = hex_crc(file_crc32c(index_file(step), "checkpoint index"));
  write_file_atomically(fs::path(step_dir(step)) / kCommitted, mark.dump() + "\n");
  write_file_atomically(fs::path(root_) / kLatest, step_name(step) + "\n");
  remove_pruned_leftovers();
  // Prune the step directories older than this one beyond the newest `keep` (committed or
  // not); never the one just committed.
  std::vector<int64_t> older;
  std::error_code ec;
  // With error codes: an entry that cannot be looked at (a symlink loop) is not a step to prune.
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::optional<int64_t> s = step_of_name(entry.path().filename().string());
    if (s && *s < step && entry.is_directory(ec)) older.push_back(*s);
  }
  std::sort(older.begin(), older.end());
  const int64_t to_remove = int64_t(older.size()) - (keep - 1);
  for (int64_t i = 0; i < to_remove; ++i) {
    const fs::path doomed = fs::path(root_) / (kPrunedPrefix + step_name(older[i]));
    std::error_code ec;
    fs::rename(step_dir(older[i]), doomed, ec);
    if (ec) fail("cannot prune '", step_dir(older[i]), "': ", ec.message());
    fs::remove_all(doomed);
  }
}

std::vector<std::string> CheckpointDir::move_non_directories_aside() const {
  std::vector<std::string> moved;
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(root_, ec))
    if (step_of_name(entry.path().filename().string()) && !entry.is_directory(ec))
      doomed.push_back(entry.path());
  for (const fs::path& path : doomed) {
    const std::string aside = free_unusable_name(path.string());
    fs::rename(path, aside, ec);
    if (!ec) moved.push_back("'" + path.string() + "' -> '" + aside + "'");
  }
  return moved;
}

void CheckpointDir::remove_pruned_leftovers() const {
  std::error_code ec;
  std::vector<fs::path> leftovers;
  for (const auto& entry : fs::directory_iterator(root_, ec))
    if (entry.path().filename().string().rfind(kPrunedPrefix, 0) == 0)
      leftovers.push_back(entry.path());
  for (const fs::path& p : leftovers) fs::remove_all(p, ec);
}

std::optional<CheckpointDir::CommitMark> CheckpointDir::commit_mark(int64_t step) const {
  const fs::path path = fs::path(step_dir(step)) / kCommitted;
  if (!something_at(path)) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(read_small_file(path, "commit marker"));
    CommitMark mark;
    mark.world_size = int(json_integer(j.at("world_size"), "world_size", 1, 1 << 24));
    if (json_integer(j.at("step"), "step") != step) return std::nullopt;
    if (j.contains("index_crc32c")) {
      // Eight lower-case hex digits, as commit() writes them; anything else is a damaged mark.
      const std::string text = j.at("index_crc32c").get<std::string>();
      if (text.size() != 8) return std::nullopt;
      uint32_t crc = 0;
      for (char c : text) {
        const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0) return std::nullopt;
        crc = crc << 4 | uint32_t(digit);
      }
      mark.index_crc32c = crc;
    }
    return mark;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<int> CheckpointDir::committed_world_size(int64_t step) const {
  const std::optional<CommitMark> mark = commit_mark(step);
  if (!mark) return std::nullopt;
  return mark->world_size;
}

std::string CheckpointDir::index_file(int64_t step) const {
  return (fs::path(step_dir(step)) / "index.h5").string();
}

std::vector<int64_t> CheckpointDir::committed_steps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return steps;
  const Pointer pointer = read_pointer(root_);
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::optional<int64_t> step = step_of_name(entry.path().filename().string());
    if (!step || !entry.is_directory(ec)) continue;
    bool complete = false;
    if (const std::optional<int> world = committed_world_size(*step)) {
      complete = true;
      for (int rank = 0; rank < *world && complete; ++rank)
        complete = fs::is_regular_file(rank_file(*step, rank), ec);
    } else {
      // Written before COMMITTED existed: committed when LATEST had reached it.
      complete =
          pointer.step && *step <= *pointer.step && fs::is_regular_file(rank_file(*step, 0), ec);
    }
    if (complete) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::vector<std::pair<int64_t, std::string>> CheckpointDir::incomplete_steps() const {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::optional<int64_t> step = step_of_name(entry.path().filename().string());
    if (!step) continue;
    if (!entry.is_directory(ec)) {
      // A step's name on something that is no directory (a symlink loop, a FIFO): whatever the
      // step was, it is unusable now.
      const std::string kind = non_regular_kind(entry.path().string());
      steps.emplace_back(*step, "step directory '" + entry.path().string() + "' is " +
                                    (kind.empty() ? std::string("a regular file") : kind) +
                                    ", not a directory");
      continue;
    }
    const std::optional<int> world = committed_world_size(*step);
    for (int rank = 0; world && rank < *world; ++rank) {
      const std::string kind = non_regular_kind(rank_file(*step, rank));
      if (!kind.empty()) {
        steps.emplace_back(*step, "checkpoint file '" + rank_file(*step, rank) + "' is " + kind +
                                      ", not a regular file (its step was committed with " +
                                      std::to_string(*world) + " rank files)");
        break;
      }
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::optional<int64_t> CheckpointDir::latest() const {
  const std::vector<int64_t> steps = committed_steps();
  if (steps.empty()) return std::nullopt;
  return steps.front();
}

std::string CheckpointDir::latest_problem() const {
  const std::vector<int64_t> steps = committed_steps();
  const Pointer pointer = read_pointer(root_);
  const std::string path = (fs::path(root_) / kLatest).string();
  if (!pointer.exists) return steps.empty() ? "" : "'" + path + "' is missing";
  if (!pointer.problem.empty()) return pointer.problem;
  if (std::find(steps.begin(), steps.end(), *pointer.step) == steps.end())
    return "'" + path + "' names " + step_name(*pointer.step) +
           ", which is not a committed step on disk (its directory is missing or incomplete)";
  if (*pointer.step != steps.front())
    return "'" + path + "' names " + step_name(*pointer.step) + ", but " +
           step_name(steps.front()) + " is newer and committed";
  return "";
}

std::string CheckpointDir::set_aside() const {
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return "";
  std::vector<fs::path> moving;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == kLatest || step_of_name(name))  // a step's name on a non-directory too
      moving.push_back(entry.path());
  }
  remove_pruned_leftovers();
  if (moving.empty()) return "";
  fs::path aside;
  for (int n = 1;; ++n) {
    aside = fs::path(root_) / ("earlier_run_" + std::to_string(n));
    if (!fs::exists(aside, ec)) break;
  }
  fs::create_directories(aside, ec);
  if (ec) fail("cannot create '", aside.string(), "': ", ec.message());
  for (const fs::path& p : moving) {
    fs::rename(p, aside / p.filename(), ec);
    if (ec) fail("cannot move '", p.string(), "' to '", aside.string(), "': ", ec.message());
  }
  fsync_path(root_, true);
  return aside.string();
}

nlohmann::json CheckpointDir::manifest(int64_t step, int rank) const {
  return read_manifest(H5Reader(rank_file(step, rank)));
}

H5Reader CheckpointDir::open_rank(int64_t step, int rank,
                                  const nlohmann::json& rank0_manifest) const {
  H5Reader reader(rank_file(step, rank));
  check_manifest_agrees(reader.path(), read_manifest(reader), rank0_manifest, step, rank);
  return reader;
}

namespace {

// Every tensor of an opened rank file read back (Fletcher32 and CRC32C).
CheckpointDir::RankSummary read_every_tensor(const H5Reader& reader) {
  CheckpointDir::RankSummary summary;
  for (const std::string& name : reader.tensor_names()) {
    // The lookups the loaders make (has, then read), on every dataset.
    if (!reader.has(name))
      fail("checkpoint file '", reader.path(), "': dataset ", name,
           " is listed but cannot be opened");
    const Tensor t = reader.read_tensor(name);
    ++summary.tensors;
    summary.bytes += int64_t(t.bytes());
  }
  return summary;
}

}  // namespace

CheckpointDir::RankSummary CheckpointDir::verify_rank(int64_t step, int rank,
                                                      const nlohmann::json& rank0_manifest) const {
  return read_every_tensor(open_rank(step, rank, rank0_manifest));
}

CheckpointDir::RankSummary CheckpointDir::verify_rank0(int64_t step,
                                                       nlohmann::json& manifest) const {
  const H5Reader reader(rank_file(step, 0));
  manifest = read_manifest(reader);
  check_manifest_agrees(reader.path(), manifest, manifest, step, 0);
  return read_every_tensor(reader);
}

std::vector<std::string> CheckpointDir::temporary_files() const {
  std::vector<std::string> found;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return found;
  // With error codes throughout: an entry that cannot be looked at (a symlink loop) is skipped,
  // not a reason to stop a resume or a listing.
  std::error_code entry_ec;  // of one entry: the walk goes on
  for (fs::recursive_directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(entry_ec) && it->path().extension() == ".tmp")
      found.push_back(it->path().string());
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace frugal
