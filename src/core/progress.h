// A progress line for work that takes minutes (tokenizing a large corpus, loading a 70B
// model): at most one line every `interval_s` seconds, "prepare: encoded 1210.33 MB of 9800.00
// MB (12 %) in 41s, about 4m50s left" (core/duration.h's format, as the training's ETA), through
// log_line (rank 0 prints). Thread-safe: OpenMP loops call advance.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace frugal {

class Progress {
 public:
  using Clock = std::function<double()>;  // seconds, from any origin
  using Sink = std::function<void(const std::string&)>;
  using Format = std::function<std::string(int64_t)>;

  // "prepare: encoded" of `total` amounts, each shown by `format` (as MB, as a count...); the
  // sink and the clock are log_line and steady_clock unless a test gives its own.
  Progress(std::string what, int64_t total, Format format, double interval_s = 10,
           Sink sink = nullptr, Clock clock = nullptr);
  // Adds `amount` done; says so when interval_s has passed since the last line (or the start).
  void advance(int64_t amount);
  int64_t done() const;

 private:
  std::string what_;
  int64_t total_;
  Format format_;
  double interval_s_;
  Sink sink_;
  Clock clock_;
  double start_ = 0;
  std::atomic<double> last_line_{0};  // read without the lock: advance is called per item
  std::atomic<int64_t> done_{0};
  std::mutex mutex_;  // one line at a time
};

}  // namespace frugal
