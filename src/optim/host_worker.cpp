// HostWorker: one thread and a queue.
#include "optim/host_worker.h"

namespace frugal {

HostWorker::HostWorker() : thread_([this] { run(); }) {}

HostWorker::~HostWorker() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_one();
  thread_.join();
}

std::future<void> HostWorker::submit(std::function<void()> work) {
  std::packaged_task<void()> task(std::move(work));
  std::future<void> done = task.get_future();
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  ready_.notify_one();
  return done;
}

void HostWorker::run() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // an exception goes to the future
  }
}

}  // namespace frugal
