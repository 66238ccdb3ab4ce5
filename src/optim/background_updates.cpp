#include "optim/background_updates.h"

namespace frugal {

BackgroundUpdates::~BackgroundUpdates() {
  if (thread_.joinable()) thread_.join();
}

void BackgroundUpdates::start(size_t n_units, std::function<void(size_t unit)> update) {
  wait_all();
  units_done_ = 0;
  n_units_ = n_units;
  error_ = nullptr;
  thread_ = std::thread([this, n_units, update = std::move(update)] {
    for (size_t u = 0; u < n_units; ++u) {
      std::exception_ptr error;
      try {
        update(u);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (error)
          error_ = error;  // releases the waiters of this unit and later ones
        else
          units_done_ = u + 1;
      }
      unit_done_.notify_all();
      if (error) return;
    }
  });
}

void BackgroundUpdates::wait(size_t unit) {
  if (!thread_.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    unit_done_.wait(
        lock, [&] { return units_done_ > unit || units_done_ == n_units_ || error_ != nullptr; });
    if (units_done_ > unit || !error_) return;  // its update is done (or unit is past the run)
  }
  wait_all();  // joins and rethrows
}

void BackgroundUpdates::wait_all() {
  if (!thread_.joinable()) return;
  thread_.join();
  if (error_) {
    const std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

}  // namespace frugal
