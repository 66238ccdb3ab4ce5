// Step directories, atomic commit through LATEST, pruning, and loading with verification.
#include "ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ckpt/crc32c.h"
#include "ckpt/h5_file.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

constexpr const char* kManifest = "manifest";
// The manifest is an attribute, outside the datasets' Fletcher32 and CRC32C: it gets its own.
constexpr const char* kManifestCrc = "manifest_crc32c";

std::string crc_text(const std::string& text) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc32c(text.data(), text.size()));
  return buf;
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

// Writes `text` to path atomically: a temporary file, fsync, rename.
void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) fail("cannot write '", tmp.string(), "'");
  }
  int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("cannot rename '", tmp.string(), "' to '", path.string(), "': ", ec.message());
}

}  // namespace

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
  writer.close();
}

void CheckpointDir::commit(int64_t step, int64_t keep) const {
  write_file_atomically(fs::path(root_) / "LATEST", step_name(step) + "\n");
  // Prune committed steps beyond the newest `keep`; never the one just committed.
  std::vector<fs::path> steps;
  for (const auto& entry : fs::directory_iterator(root_))
    if (entry.is_directory() && entry.path().filename().string().rfind("step_", 0) == 0)
      steps.push_back(entry.path());
  std::sort(steps.begin(), steps.end());
  const fs::path current = step_dir(step);
  std::vector<fs::path> older;
  for (const fs::path& p : steps)
    if (p.filename() < current.filename()) older.push_back(p);
  const int64_t to_remove = int64_t(older.size()) - (keep - 1);
  for (int64_t i = 0; i < to_remove; ++i) fs::remove_all(older[i]);
}

std::optional<int64_t> CheckpointDir::latest() const {
  const fs::path latest = fs::path(root_) / "LATEST";
  if (!fs::exists(latest)) return std::nullopt;
  std::ifstream in(latest);
  std::string name;
  in >> name;
  long long step = -1;
  if (name.rfind("step_", 0) != 0 || std::sscanf(name.c_str() + 5, "%lld", &step) != 1 || step < 0)
    fail("checkpoint pointer '", latest.string(), "' holds '", name,
         "', not a step name such as step_00000100");
  if (!fs::is_directory(step_dir(step)))
    fail("checkpoint pointer '", latest.string(), "' names ", name, " but '", step_dir(step),
         "' does not exist");
  return step;
}

std::vector<int64_t> CheckpointDir::committed_steps() const {
  std::vector<int64_t> steps;
  const std::optional<int64_t> newest = latest();
  if (!newest) return steps;
  for (const auto& entry : fs::directory_iterator(root_)) {
    const std::string name = entry.path().filename().string();
    long long step = -1;
    if (entry.is_directory() && name.rfind("step_", 0) == 0 &&
        std::sscanf(name.c_str() + 5, "%lld", &step) == 1 && step <= *newest)
      steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

namespace {
nlohmann::json read_manifest(const H5Reader& reader) {
  const std::string text = reader.attribute(kManifest);
  const bool has_crc = reader.has_attribute(kManifestCrc);
  if (has_crc && reader.attribute(kManifestCrc) != crc_text(text))
    fail("checkpoint file '", reader.path(), "': manifest checksum mismatch (the file is corrupt)");
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint file '", reader.path(), "': manifest is not valid JSON: ", e.what());
  }
  // Version 1 files predate the manifest checksum; every later one must carry it.
  if (!has_crc && manifest.value("format", std::string()) != "frugal-checkpoint-1")
    fail("checkpoint file '", reader.path(), "': manifest has no checksum");
  return manifest;
}

}  // namespace

nlohmann::json CheckpointDir::manifest(int64_t step) const {
  return read_manifest(H5Reader(rank_file(step, 0)));
}

CheckpointDir::Loaded CheckpointDir::load_rank(int64_t step, int rank) const {
  H5Reader reader(rank_file(step, rank));
  Loaded loaded;
  loaded.manifest = read_manifest(reader);
  for (const std::string& name : reader.tensor_names())
    loaded.tensors.push_back({name, reader.read_tensor(name)});
  return loaded;
}

std::vector<std::string> CheckpointDir::temporary_files() const {
  std::vector<std::string> found;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return found;
  for (const auto& entry : fs::recursive_directory_iterator(root_, ec))
    if (entry.is_regular_file() && entry.path().extension() == ".tmp")
      found.push_back(entry.path().string());
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace frugal
