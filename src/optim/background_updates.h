// The optimizer's update of a model's units, one unit after the other on a thread of its own,
// while the caller goes on and waits only for the unit it needs next. ZeRO-3 with the optimizer
// on the host (offload) runs AdamW this way: the GPU computes the next forward of unit u while
// the host updates the units after it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace frugal {

class BackgroundUpdates {
 public:
  BackgroundUpdates() = default;
  BackgroundUpdates(const BackgroundUpdates&) = delete;
  BackgroundUpdates& operator=(const BackgroundUpdates&) = delete;
  ~BackgroundUpdates();  // waits for the thread; an error it met is dropped

  // Runs update(0), update(1), ... update(n_units - 1) in that order on a new thread, after
  // waiting for the previous run (and rethrowing its error). An exception from update stops
  // the run; the first wait that needs a unit from there on rethrows it, once.
  void start(size_t n_units, std::function<void(size_t unit)> update);
  // Returns once update(unit) has returned (at once when no run is going on; for a unit past
  // the run's units, once the run is over); rethrows the run's error when update(unit) did
  // not complete.
  void wait(size_t unit);
  // Returns once the run is over (joins the thread); rethrows its error.
  void wait_all();

 private:
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable unit_done_;
  // Guarded by mutex_ while the thread runs: units completed, units of the run, its error.
  size_t units_done_ = 0, n_units_ = 0;
  std::exception_ptr error_;
};

}  // namespace frugal
