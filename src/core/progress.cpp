#include "core/progress.h"

#include <cmath>
#include <utility>

#include "core/duration.h"
#include "core/log.h"

namespace frugal {

Progress::Progress(std::string what, int64_t total, Format format, double interval_s, Sink sink,
                   Clock clock)
    : what_(std::move(what)),
      total_(total),
      format_(std::move(format)),
      interval_s_(interval_s),
      sink_(sink ? std::move(sink) : Sink([](const std::string& line) { log_line(line); })),
      clock_(clock ? std::move(clock) : Clock(now_seconds)) {
  start_ = last_line_ = clock_();
}

void Progress::advance(int64_t amount) {
  const int64_t done = done_ += amount;
  const double now = clock_();
  if (now - last_line_ < interval_s_ || done >= total_) return;  // the caller says "done"
  std::lock_guard<std::mutex> lock(mutex_);
  if (now - last_line_ < interval_s_) return;  // another thread said it meanwhile
  last_line_ = now;
  const double elapsed = now - start_;
  const double fraction = total_ > 0 ? double(done) / double(total_) : 0;
  std::string line = what_ + " " + format_(done) + " of " + format_(total_) + " (" +
                     std::to_string(int(std::floor(100 * fraction))) + " %) in " +
                     format_duration(elapsed);
  if (fraction > 0) line += ", about " + format_duration(elapsed * (1 - fraction) / fraction) + " left";
  sink_(line);
}

int64_t Progress::done() const { return done_; }

}  // namespace frugal
