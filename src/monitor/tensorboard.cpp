// TensorBoard's event files, encoded by hand: three small messages of protobuf's wire format
// (doc/dependencies.md says why not libprotobuf) in TFRecord framing.
#include "monitor/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>

#include "ckpt/crc32c.h"
#include "core/error.h"

namespace frugal {

namespace fs = std::filesystem;

namespace {

// Protobuf's wire types and a field's key: (field number << 3) | wire type.
enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void put_key(std::string& out, int field, WireType type) {
  put_varint(out, (uint64_t(field) << 3) | type);
}

template <class T>
void put_little_endian(std::string& out, T value) {  // the host is little-endian (x86, arm64)
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event's fields 1 and 2, in field order as protobuf writes them (a zero step, proto3's
// default, is left out as protobuf does, so the bytes are the library's own).
std::string event_head(double wall_time, int64_t step) {
  std::string out;
  put_key(out, 1, kFixed64);
  put_little_endian(out, wall_time);
  if (step != 0) {
    put_key(out, 2, kVarint);
    put_varint(out, static_cast<uint64_t>(step));
  }
  return out;
}

double system_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The <seconds> of an event file's name (events.out.tfevents.<seconds>.<host>...), or -1.
int64_t name_seconds(const std::string& name) {
  const std::string prefix = "events.out.tfevents.";
  if (name.rfind(prefix, 0) != 0) return -1;
  int64_t seconds = 0;
  size_t i = prefix.size();
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
    if (seconds > (INT64_MAX - 9) / 10) return -1;
    seconds = seconds * 10 + (name[i] - '0');
  }
  return seconds;
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == 0) return "localhost";
  std::string name = host;
  for (char& ch : name)
    if (ch == '/') ch = '_';
  return name;
}

}  // namespace

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  put_little_endian(out, static_cast<uint64_t>(data.size()));
  put_little_endian(out, masked_crc32c(out));
  out.append(data);
  put_little_endian(out, masked_crc32c(data));
  return out;
}

std::string file_version_event(double wall_time, std::string_view version) {
  std::string out = event_head(wall_time, 0);
  put_bytes(out, 3, version);
  return out;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string session_log;
  put_key(session_log, 1, kVarint);
  put_varint(session_log, 1);  // SessionLog.START
  std::string out = event_head(wall_time, step);
  put_bytes(out, 7, session_log);
  return out;
}

std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_key(v, 2, kFixed32);  // simple_value: TensorBoard's scalars are float32
    put_little_endian(v, static_cast<float>(value));
    put_bytes(summary, 1, v);
  }
  std::string out = event_head(wall_time, step);
  put_bytes(out, 5, summary);
  return out;
}

namespace {

void add_scalars(const nlohmann::json& value, const std::string& path,
                 std::vector<std::pair<std::string, double>>& out) {
  if (value.is_number()) {
    out.emplace_back(path, value.get<double>());
  } else if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it)
      add_scalars(it.value(), path.empty() ? it.key() : path + "/" + it.key(), out);
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i)
      add_scalars(value[i], path + "/" + std::to_string(i), out);
  }
}

}  // namespace

std::vector<std::pair<std::string, double>> record_scalars(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> out;
  if (!record.is_object()) return out;
  for (auto it = record.begin(); it != record.end(); ++it)
    if (it.key() != "step") add_scalars(it.value(), it.key(), out);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step, Clock clock)
    : clock_(clock ? std::move(clock) : Clock(system_seconds)) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    fail("config key 'monitor.tensorboard': cannot create the directory '", dir, "'",
         ec ? ": " + ec.message() : std::string());
  // TensorBoard reads a run's event files in name order: this one must come after the others.
  const double now = clock_();
  int64_t seconds = static_cast<int64_t>(now);
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const int64_t other = name_seconds(entry.path().filename().string());
    if (other >= seconds) seconds = other + 1;
  }
  const std::string host = host_name(), pid = std::to_string(getpid());
  for (int tries = 0; !file_ && tries < 100; ++tries, ++seconds) {
    // Appended part by part: GCC 12 warns falsely (-Wrestrict) about "." + a temporary string.
    std::string name = "events.out.tfevents.";
    name.append(std::to_string(seconds)).append(".").append(host).append(".").append(pid);
    name.append(".frugal");
    path_ = (fs::path(dir) / name).string();
    file_ = std::fopen(path_.c_str(), "wbx");  // never over another writer's file
    if (!file_ && errno != EEXIST) break;
  }
  if (!file_)
    fail("config key 'monitor.tensorboard': cannot create the event file '", path_,
         "': ", std::strerror(errno));
  append(file_version_event(now));
  append(session_start_event(clock_(), first_step));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::append(const std::string& event) {
  const std::string record = tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0)
    fail("cannot write to the TensorBoard event file '", path_, "'");
}

void TensorBoardWriter::write(const nlohmann::json& record) {
  const std::vector<std::pair<std::string, double>> scalars = record_scalars(record);
  if (scalars.empty()) return;
  append(scalars_event(clock_(), record.value("step", int64_t(0)), scalars));
}

void TensorBoardWriter::restart_at(int64_t step) { append(session_start_event(clock_(), step)); }

}  // namespace frugal
