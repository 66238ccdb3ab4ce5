// TensorBoard event files (monitor.tensorboard) against what the tensorboard package read from
// files frugal wrote (tests/fixtures/tensorboard, made by tools/make_tensorboard_fixtures.py):
// the same records give the same bytes, and TensorBoard's view of a crashed and resumed run, and
// of a rolled-back one, holds every number of metrics.jsonl once, at its step.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "monitor/tensorboard.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kFixtures = fs::path(FRUGAL_SOURCE_DIR) / "tests/fixtures/tensorboard";

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<json> read_records(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::vector<json> records;
  for (std::string line; std::getline(in, line);) records.push_back(json::parse(line));
  return records;
}

// The only event file in `dir`.
fs::path only_event_file(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  REQUIRE(files.size() == 1);
  return files[0];
}

// A clock that gives the wall times TensorBoard read from one file, in order.
TensorBoardWriter::Clock replayed_clock(const json& file) {
  auto times = std::make_shared<std::vector<double>>();
  for (const json& event : file["events"]) times->push_back(event["wall_time"].get<double>());
  auto next = std::make_shared<size_t>(0);
  return [times, next]() {
    REQUIRE(*next < times->size());
    return (*times)[(*next)++];
  };
}

}  // namespace

TEST_CASE("tensorboard: frugal's records give the bytes TensorBoard read", "[tensorboard]") {
  const json read = json::parse(read_bytes(kFixtures / "tensorboard.json"));
  REQUIRE(read["files"].size() == 2);
  // The first run started fresh at step 0; the resumed one at the checkpoint's step + 1.
  const int64_t resumed_from = 4;
  const std::pair<const char*, int64_t> runs[] = {{"run1.jsonl", 0},
                                                  {"run2.jsonl", resumed_from + 1}};
  TempDir tmp;
  for (size_t r = 0; r < 2; ++r) {
    const json& file = read["files"][r];
    const fs::path dir = tmp.path / std::to_string(r);
    {
      TensorBoardWriter writer(dir.string(), runs[r].second, replayed_clock(file));
      for (const json& record : read_records(kFixtures / runs[r].first)) writer.write(record);
    }
    const fs::path written = only_event_file(dir);
    CHECK(written.filename().string().rfind("events.out.tfevents.", 0) == 0);
    CHECK(written.extension() == ".frugal");
    CHECK(read_bytes(written) ==
          read_bytes(kFixtures / "events" / file["name"].get<std::string>()));
    // As TensorBoard read them: the file version, the session start, then one event a record.
    const json& events = file["events"];
    CHECK(events[0]["file_version"] == "brain.Event:2");
    CHECK(events[1]["session_log"] == "START");
    CHECK(events[1]["step"] == runs[r].second);
    CHECK(events.size() == read_records(kFixtures / runs[r].first).size() + 2);
  }
}

namespace {

// TensorBoard's view of a run (`scalars`: tag -> [[step, value], ...]) against its final
// metrics.jsonl: every number of every record (json's flatten: "/seconds/forward_backward") at
// its step, each step once, nothing else.
void check_view(const json& scalars, const fs::path& metrics) {
  std::map<std::string, std::map<int64_t, double>> expected;
  for (const json& record : read_records(metrics)) {
    const int64_t step = record["step"].get<int64_t>();
    const json flat = record.flatten();
    for (const auto& [pointer, value] : flat.items())
      if (pointer != "/step" && value.is_number())
        expected[pointer.substr(1)][step] = value.get<double>();
  }
  REQUIRE(expected.count("loss"));
  REQUIRE(expected.count("val_loss"));
  std::map<std::string, std::map<int64_t, double>> seen;
  for (const auto& [tag, points] : scalars.items()) {
    int64_t previous = -1;
    for (const json& point : points) {
      const int64_t step = point[0].get<int64_t>();
      CHECK(step > previous);  // each step once, in order
      previous = step;
      seen[tag][step] = point[1].get<double>();
    }
  }
  CHECK(seen.size() == expected.size());
  for (const auto& [tag, by_step] : expected) {
    INFO(tag);
    REQUIRE(seen.count(tag));
    CHECK(seen[tag].size() == by_step.size());
    for (const auto& [step, value] : by_step) {
      INFO("step " << step);
      REQUIRE(seen[tag].count(step));
      CHECK(seen[tag][step] == double(float(value)));  // simple_value is a float
    }
  }
}

}  // namespace

TEST_CASE("tensorboard: a resumed run's view holds every number of metrics.jsonl once",
          "[tensorboard]") {
  const json read = json::parse(read_bytes(kFixtures / "tensorboard.json"));
  check_view(read["scalars"], kFixtures / "metrics.jsonl");
}

TEST_CASE("tensorboard: a rolled-back run's view holds the steps trained again once",
          "[tensorboard]") {
  const json read = json::parse(read_bytes(kFixtures / "tensorboard.json"));
  check_view(read["rollback"]["scalars"], kFixtures / "rollback/metrics.jsonl");
  // The rollback's own record, at the step it went back to.
  CHECK(read["rollback"]["scalars"]["rollback/from_step"] == json::parse("[[20, 23.0]]"));
}

TEST_CASE("tensorboard: a record's scalars are its numbers at any depth", "[tensorboard]") {
  const json record = json::parse(
      R"({"step": 7, "loss": 2.5, "skipped": true, "loss_text": "x", "grad_norm": null,
          "seconds": {"forward_backward": 0.25, "optimizer": 1},
          "health": {"slow_ranks": [3, 5], "units": {"layers.0": {"grad_norm": 0.5}}}})");
  const std::vector<std::pair<std::string, double>> want = {
      {"health/slow_ranks/0", 3},
      {"health/slow_ranks/1", 5},
      {"health/units/layers.0/grad_norm", 0.5},
      {"loss", 2.5},
      {"seconds/forward_backward", 0.25},
      {"seconds/optimizer", 1}};
  CHECK(record_scalars(record) == want);
  CHECK(record_scalars(json::parse(R"({"step": 3})")).empty());
}

TEST_CASE("tensorboard: a new file sorts after the directory's others, a rollback restarts",
          "[tensorboard]") {
  TempDir tmp;
  // A file from the future (another host's clock): the new one still comes after it.
  std::ofstream(tmp.file("events.out.tfevents.2000000000.other.1.frugal")) << "";
  double now = 1000;
  std::string first_path;
  {
    TensorBoardWriter writer(tmp.path.string(), 0, [&now] { return now; });
    first_path = writer.path();
    writer.write(json{{"step", 1}, {"loss", 3.0}});
    writer.restart_at(1);
    writer.write(json{{"step", 1}, {"loss", 2.0}});
  }
  CHECK(fs::path(first_path).filename().string().rfind("events.out.tfevents.2000000001.", 0) == 0);
  // Two writers in the same second (a quick resume): distinct names, in order of creation.
  TensorBoardWriter second(tmp.path.string(), 2, [&now] { return now; });
  CHECK(fs::path(second.path()).filename().string().rfind("events.out.tfevents.2000000002.", 0) ==
        0);
  // The first file: version, start at 0, loss at 1, start at 1, loss at 1 again.
  const std::string bytes = read_bytes(first_path);
  std::string expected = tfrecord(file_version_event(now)) + tfrecord(session_start_event(now, 0)) +
                         tfrecord(scalars_event(now, 1, {{"loss", 3.0}})) +
                         tfrecord(session_start_event(now, 1)) +
                         tfrecord(scalars_event(now, 1, {{"loss", 2.0}}));
  CHECK(bytes == expected);
}

TEST_CASE("tensorboard: TFRecord framing and the masked CRC32C", "[tensorboard]") {
  // CRC32C("123456789") = 0xe3069283 (the standard check value), masked as TFRecord does:
  // rotated right by 15 bits, plus 0xa282ead8.
  const uint32_t crc = 0xe3069283u;
  CHECK(masked_crc32c("123456789") == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  const std::string record = tfrecord("abc");
  REQUIRE(record.size() == 8 + 4 + 3 + 4);
  CHECK(record.substr(0, 8) == std::string("\x03\0\0\0\0\0\0\0", 8));
  CHECK(record.substr(12, 3) == "abc");
  uint32_t length_crc = 0, data_crc = 0;
  std::memcpy(&length_crc, record.data() + 8, 4);
  std::memcpy(&data_crc, record.data() + 15, 4);
  CHECK(length_crc == masked_crc32c(record.substr(0, 8)));
  CHECK(data_crc == masked_crc32c("abc"));
}

TEST_CASE("tensorboard: an unwritable directory is named", "[tensorboard]") {
  TempDir tmp;
  std::ofstream(tmp.file("file")) << "x";
  const std::string message =
      error_of([&] { TensorBoardWriter writer(tmp.file("file") + "/tb", 0); });
  CHECK(contains(message, "monitor.tensorboard"));
  CHECK(contains(message, tmp.file("file")));
}
