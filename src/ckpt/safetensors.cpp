// safetensors: header parsing and validation, mmap reads with conversion to f32, streamed
// writes, and the sharded index.
#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/checked.h"
#include "core/regular_file.h"

namespace fs = std::filesystem;

namespace frugal {

namespace {

// The spec caps the header at 100 MB; a larger length means a corrupt or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeName {
  const char* name;
  size_t bytes;
  bool is_float;
  DType frugal;  // meaningful when is_float
};

constexpr DTypeName kDTypeNames[] = {
    {"F64", 8, true, DType::f64},      {"F32", 4, true, DType::f32},
    {"F16", 2, true, DType::f16},      {"BF16", 2, true, DType::bf16},
    {"F8_E4M3", 1, true, DType::e4m3}, {"F8_E5M2", 1, true, DType::e5m2},
    {"BOOL", 1, false, DType::u8},     {"U8", 1, false, DType::u8},
    {"I8", 1, false, DType::u8},       {"I16", 2, false, DType::u8},
    {"U16", 2, false, DType::u8},      {"I32", 4, false, DType::u8},
    {"U32", 4, false, DType::u8},      {"I64", 8, false, DType::u8},
    {"U64", 8, false, DType::u8},
};

const DTypeName* find_dtype(const std::string& name) {
  for (const DTypeName& d : kDTypeNames)
    if (name == d.name) return &d;
  return nullptr;
}

std::string safetensors_name_of(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    default:
      fail("safetensors: frugal writes f32, bf16 or f16, not ", dtype_name(t));
  }
}

std::string errno_text() { return std::strerror(errno); }

// Reads `bytes` at `src` (any alignment) as `type` into out. A misaligned source is first
// copied, a slice at a time, so the conversion reads aligned elements.
void convert_unaligned(float* out, const uint8_t* src, DType type, size_t count) {
  const size_t elem = dtype_bytes(type);
  if (reinterpret_cast<uintptr_t>(src) % elem == 0) {
    convert_to_float(out, src, type, count);
    return;
  }
  constexpr size_t kSlice = 1 << 16;
  std::vector<uint64_t> aligned((kSlice * elem + 7) / 8);
  for (size_t i = 0; i < count; i += kSlice) {
    const size_t n = std::min(kSlice, count - i);
    std::memcpy(aligned.data(), src + i * elem, n * elem);
    convert_to_float(out + i, aligned.data(), type, n);
  }
}

// Writes all of `bytes` at `offset`, retrying short writes.
void write_at(int fd, const void* data, size_t bytes, size_t offset, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("safetensors file '", path, "': write failed: ", errno_text());
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<size_t>(n);
  }
}

}  // namespace

DType safetensors_float_dtype(const std::string& name) {
  const DTypeName* d = find_dtype(name);
  if (!d || !d->is_float)
    fail("dtype '", name, "' is not a floating-point type frugal reads (F64, F32, F16, BF16, ",
         "F8_E4M3, F8_E5M2)");
  return d->frugal;
}

// --- SafetensorsFile ------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  void* map = nullptr;
  size_t file_bytes = 0;
  {
    const RegularFile file(path, "safetensors file");  // closed at once: the mapping keeps it
    file_bytes = static_cast<size_t>(file.size_bytes());
    if (file_bytes < 8)
      fail("safetensors file '", path, "' is truncated: ", file_bytes,
           " bytes, too short for the 8-byte header length");
    map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  }
  if (map == MAP_FAILED) fail("safetensors file '", path, "': mmap failed: ", errno_text());
  map_ = map;
  map_bytes_ = file_bytes;
  const auto* bytes = static_cast<const uint8_t*>(map);

  // From here on a failure must unmap: the destructor does not run for a throwing constructor.
  try {
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];
    if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8)
      fail("safetensors file '", path, "': header length ", header_bytes,
           (header_bytes > kMaxHeaderBytes ? " exceeds the 100 MB limit of the format"
                                           : " runs past the end of the file"),
           " (file has ", file_bytes, " bytes): truncated or not a safetensors file");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_bytes);
    } catch (const nlohmann::json::exception& e) {
      fail("safetensors file '", path, "': header is not valid JSON: ", e.what());
    }
    if (!header.is_object()) fail("safetensors file '", path, "': header is not a JSON object");
    data_ = bytes + 8 + header_bytes;
    const size_t data_bytes = file_bytes - 8 - header_bytes;

    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& item : header.items()) {
      // (Not a structured binding: clang before 16 cannot capture one in the lambda below.)
      const std::string& name = item.key();
      const nlohmann::json& value = item.value();
      if (name == "__metadata__") {
        if (!value.is_object())
          fail("safetensors file '", path, "': __metadata__ is not an object");
        for (const auto& [key, v] : value.items())
          metadata_[key] = v.is_string() ? v.get<std::string>() : v.dump();
        continue;
      }
      auto bad = [&](const std::string& why) {
        fail("safetensors file '", path, "': tensor '", name, "': ", why);
      };
      if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
          !value.contains("data_offsets"))
        bad("header entry needs dtype, shape and data_offsets");
      SafetensorsEntry e;
      if (!value["dtype"].is_string()) bad("dtype is not a string");
      e.dtype = value["dtype"].get<std::string>();
      const DTypeName* d = find_dtype(e.dtype);
      if (!d) bad("unknown dtype '" + e.dtype + "'");
      if (!value["shape"].is_array()) bad("shape is not an array");
      for (const auto& dim : value["shape"]) {
        if (!dim.is_number_unsigned() || dim.get<uint64_t>() > uint64_t(INT64_MAX))
          bad("shape " + value["shape"].dump() + " is not a list of sizes");
        e.shape.push_back(dim.get<int64_t>());
      }
      // The byte size, checked: a corrupt shape must not wrap around into a size that matches
      // the offsets.
      size_t expected = 0;
      try {
        expected = checked_mul(static_cast<size_t>(shape_numel(e.shape)), d->bytes,
                               "elements x bytes per ", e.dtype);
      } catch (const Error& err) {
        bad(err.what());
      }
      const auto& off = value["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
          !off[1].is_number_unsigned())
        bad("data_offsets " + off.dump() + " is not a pair of offsets");
      e.begin_bytes = off[0].get<size_t>();
      e.end_bytes = off[1].get<size_t>();
      if (e.begin_bytes > e.end_bytes) bad("data_offsets " + off.dump() + " are reversed");
      if (e.end_bytes > data_bytes)
        bad("data_offsets " + off.dump() + " run past the end of the data (" +
            std::to_string(data_bytes) + " bytes): the file is truncated");
      if (e.end_bytes - e.begin_bytes != expected)
        bad("data_offsets " + off.dump() + " hold " + std::to_string(e.end_bytes - e.begin_bytes) +
            " bytes, but shape " + shape_string(e.shape) + " of " + e.dtype + " needs " +
            std::to_string(expected));
      if (e.end_bytes > e.begin_bytes) spans.emplace_back(e.begin_bytes, e.end_bytes);
      entries_.emplace(name, std::move(e));
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].first < spans[i - 1].second)
        fail("safetensors file '", path, "': tensors overlap in the data section at byte ",
             spans[i].first);
  } catch (...) {
    ::munmap(map_, map_bytes_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

std::vector<std::string> SafetensorsFile::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, e] : entries_) names.push_back(name);
  return names;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail("safetensors file '", path_, "' has no tensor '", name, "'");
  return it->second;
}

void SafetensorsFile::read_rows_into(const std::string& name, int64_t row_begin, int64_t row_end,
                                     const Tensor& out) const {
  const SafetensorsEntry& e = entry(name);
  DType type = DType::f32;
  try {
    type = safetensors_float_dtype(e.dtype);
  } catch (const Error& err) {
    fail("safetensors file '", path_, "': tensor '", name, "': ", err.what());
  }
  const int64_t rows = e.shape.empty() ? 1 : e.shape[0];
  const int64_t row_elems = rows == 0 ? 0 : shape_numel(e.shape) / rows;
  if (row_begin < 0 || row_begin > row_end || row_end > rows)
    fail("safetensors file '", path_, "': tensor '", name, "' of shape ", shape_string(e.shape),
         ": rows [", row_begin, ", ", row_end, ") are out of range");
  const int64_t count = (row_end - row_begin) * row_elems;
  FRUGAL_CHECK(out.dtype() == DType::f32 && out.device() == Device::cpu && out.numel() == count,
               "read_rows_into '", name, "': output ", shape_string(out.shape()), " ",
               dtype_name(out.dtype()), " for ", count, " elements");
  const size_t elem = dtype_bytes(type);
  const uint8_t* src = data_ + e.begin_bytes + static_cast<size_t>(row_begin * row_elems) * elem;
  const size_t src_bytes = static_cast<size_t>(count) * elem;
  convert_unaligned(out.data<float>(), src, type, static_cast<size_t>(count));
  // Unmap the pages just read, so that loading a model tensor by tensor does not leave the
  // whole file in this process's resident memory. They stay in the page cache; a later read
  // faults them back in.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(src) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(src) + src_bytes + page - 1) / page * page;
  if (src_bytes > 0) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

Tensor SafetensorsFile::read_rows(const std::string& name, int64_t row_begin, int64_t row_end,
                                  Arena& arena) const {
  const SafetensorsEntry& e = entry(name);
  Shape shape = e.shape;
  if (shape.empty()) {
    if (row_begin != 0 || row_end != 1)
      fail("safetensors file '", path_, "': tensor '", name, "' is a scalar: rows [", row_begin,
           ", ", row_end, ") are out of range");
  } else {
    shape[0] = std::max<int64_t>(0, row_end - row_begin);
  }
  Tensor out = Tensor::empty(shape, DType::f32, arena);
  read_rows_into(name, row_begin, row_end, out);
  return out;
}

Tensor SafetensorsFile::read(const std::string& name, Arena& arena) const {
  const SafetensorsEntry& e = entry(name);
  return read_rows(name, 0, e.shape.empty() ? 1 : e.shape[0], arena);
}

// --- SafetensorsSet -------------------------------------------------------------------------

namespace {

// Whether anything is at `path` (a symlink loop or a dangling symlink too: opening it then says
// what it is); an Error naming it (as `what`) when that cannot be told, e.g. for a name too
// long or a directory without permission, where std::filesystem would throw its own.
bool path_exists(const fs::path& path, const std::string& what) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(path, ec);
  if (ec && status.type() != fs::file_type::not_found)
    fail(what, " '", path.string(), "' cannot be accessed: ", ec.message());
  return status.type() != fs::file_type::not_found;
}

}  // namespace

SafetensorsSet::SafetensorsSet(const std::string& dir) : dir_(dir) {
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  if (path_exists(index_path, "safetensors index")) {
    description_ = index_path.string();
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(read_regular_file(index_path.string(), "safetensors index"));
    } catch (const nlohmann::json::exception& e) {
      fail("safetensors index '", description_, "' is not valid JSON: ", e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail("safetensors index '", description_, "' has no \"weight_map\" object");
    std::map<std::string, const SafetensorsFile*> opened;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string())
        fail("safetensors index '", description_, "': tensor '", name, "' maps to a non-string ",
             shard.dump());
      const std::string shard_name = shard.get<std::string>();
      if (shard_name.find('/') != std::string::npos)
        fail("safetensors index '", description_, "': tensor '", name, "' maps to '", shard_name,
             "', which is not a file name in the same directory");
      auto it = opened.find(shard_name);
      if (it == opened.end()) {
        const fs::path shard_path = fs::path(dir) / shard_name;
        if (!path_exists(shard_path, "safetensors index '" + description_ + "': shard"))
          fail("safetensors index '", description_, "': shard '", shard_path.string(),
               "' (holding tensor '", name, "') is missing");
        files_.push_back(std::make_unique<SafetensorsFile>(shard_path.string()));
        it = opened.emplace(shard_name, files_.back().get()).first;
      }
      if (!it->second->has(name))
        fail("safetensors index '", description_, "' maps tensor '", name, "' to '",
             it->second->path(), "', which does not hold it");
      file_of_[name] = it->second;
    }
  } else if (path_exists(single_path, "safetensors file")) {
    description_ = single_path.string();
    files_.push_back(std::make_unique<SafetensorsFile>(single_path.string()));
    for (const std::string& name : files_.back()->tensor_names())
      file_of_[name] = files_.back().get();
  } else {
    fail("'", dir, "' holds neither model.safetensors nor model.safetensors.index.json");
  }
}

std::vector<std::string> SafetensorsSet::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, f] : file_of_) names.push_back(name);
  return names;
}

const SafetensorsFile& SafetensorsSet::file_of(const std::string& name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) fail("'", description_, "' has no tensor '", name, "'");
  return *it->second;
}

// --- SafetensorsWriter ----------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<Spec>& specs,
                                     DType dtype,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tmp_path_(path + ".tmp"), dtype_(dtype) {
  const std::string type_name = safetensors_name_of(dtype);
  // Sorted by name (a std::map), each tensor right after the previous one. With 2- and
  // 4-byte elements and the data section 8-byte aligned, every tensor starts at a multiple
  // of its element size.
  for (const Spec& s : specs) {
    if (entries_.count(s.name)) fail("safetensors file '", path, "': tensor '", s.name, "' twice");
    entries_[s.name] = {type_name, s.shape, 0, 0};
  }
  nlohmann::ordered_json header;
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  size_t offset = 0;
  for (auto& [name, e] : entries_) {
    e.begin_bytes = offset;
    offset = checked_add(offset, shape_bytes(e.shape, dtype), "safetensors file '", path,
                         "': the data size");
    e.end_bytes = offset;
    header[name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {e.begin_bytes, e.end_bytes}}};
    written_[name] = false;
  }
  std::string text = header.empty() ? std::string("{}") : header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  data_start_ = 8 + text.size();
  file_bytes_ = data_start_ + offset;

  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("safetensors file '", tmp_path_, "': cannot create: ", errno_text());
  try {
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(text.size() >> (8 * i));
    write_at(fd_, length, 8, 0, tmp_path_);
    write_at(fd_, text.data(), text.size(), 8, tmp_path_);
    if (::ftruncate(fd_, static_cast<off_t>(file_bytes_)) != 0)
      fail("safetensors file '", tmp_path_, "': cannot size to ", file_bytes_,
           " bytes: ", errno_text());
  } catch (...) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
    fd_ = -1;
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void SafetensorsWriter::write(const std::string& name, const Tensor& values) {
  FRUGAL_CHECK(fd_ >= 0, "safetensors write of '", name, "' after close");
  auto it = entries_.find(name);
  if (it == entries_.end())
    fail("safetensors file '", path_, "': tensor '", name, "' was not declared");
  const SafetensorsEntry& e = it->second;
  if (values.shape() != e.shape || values.dtype() != DType::f32 || values.device() != Device::cpu)
    fail("safetensors file '", path_, "': tensor '", name, "' is ", dtype_name(values.dtype()), " ",
         shape_string(values.shape()), ", expected f32 ", shape_string(e.shape));
  if (written_[name]) fail("safetensors file '", path_, "': tensor '", name, "' written twice");
  // Converted a slice at a time, so a large tensor does not need a second full buffer.
  constexpr size_t kSlice = 1 << 20;
  const size_t elem = dtype_bytes(dtype_);
  const auto count = static_cast<size_t>(values.numel());
  std::vector<uint8_t> buffer(std::min(kSlice, count) * elem);
  for (size_t i = 0; i < count; i += kSlice) {
    const size_t n = std::min(kSlice, count - i);
    convert_from_float(buffer.data(), dtype_, values.data<float>() + i, n);
    write_at(fd_, buffer.data(), n * elem, data_start_ + e.begin_bytes + i * elem, tmp_path_);
  }
  written_[name] = true;
}

void SafetensorsWriter::close() {
  for (const auto& [name, done] : written_)
    if (!done) fail("safetensors file '", path_, "': tensor '", name, "' was never written");
  if (::fsync(fd_) != 0) fail("safetensors file '", tmp_path_, "': fsync failed: ", errno_text());
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp_path_.c_str());
    fail("safetensors file '", path_, "': cannot rename from '", tmp_path_, "': ", why);
  }
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Spec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, t.shape()});
  SafetensorsWriter writer(path, specs, dtype, metadata);
  for (const auto& [name, t] : tensors) writer.write(name, t);
  writer.close();
}

}  // namespace frugal
