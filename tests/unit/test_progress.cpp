// core/progress.h: a line at most every interval, with the fraction and the time left from the
// rate so far; none at the end (the caller says "done").
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/duration.h"
#include "core/progress.h"

using namespace frugal;

TEST_CASE("progress: a line per interval, the share done and the time left at the rate so far",
          "[core]") {
  double now = 100;  // any origin
  std::vector<std::string> lines;
  Progress progress(
      "encoded", 100, [](int64_t n) { return std::to_string(n) + " B"; }, 10,
      [&](const std::string& line) { lines.push_back(line); }, [&] { return now; });
  progress.advance(10);  // t = 0
  now = 105;
  progress.advance(10);
  CHECK(lines.empty());  // within the first interval
  now = 112;
  progress.advance(10);  // 30 of 100 in 12 s: 70 more at 2.5 a second
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == "encoded 30 B of 100 B (30 %) in 12s, about 28s left");
  now = 115;
  progress.advance(30);
  CHECK(lines.size() == 1);  // 3 s after the last line
  now = 123;
  progress.advance(20);  // 80 of 100 in 23 s
  REQUIRE(lines.size() == 2);
  CHECK(lines[1] == "encoded 80 B of 100 B (80 %) in 23s, about 6s left");
  now = 200;
  progress.advance(20);  // all of it: the caller's own line says so
  CHECK(lines.size() == 2);
  CHECK(progress.done() == 100);
}

TEST_CASE("durations in messages: seconds, minutes and hours, as the training's ETA", "[core]") {
  CHECK(format_duration(0.4) == "0s");
  CHECK(format_duration(59.4) == "59s");
  CHECK(format_duration(61) == "1m01s");
  CHECK(format_duration(7380) == "2h03m");
  CHECK(format_duration(-3) == "?");
}
