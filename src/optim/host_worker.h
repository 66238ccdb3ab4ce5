// A thread of its own that runs host functions one after another, in the order submitted:
// GaLore's pipelined refreshes hand it their float64 factorisations so that neither the main
// thread nor the GPU waits for them.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace frugal {

class HostWorker {
 public:
  HostWorker();
  ~HostWorker();  // finishes what was submitted, then joins
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;
  // The future is ready when `work` has run; get() rethrows what it threw.
  std::future<void> submit(std::function<void()> work);

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace frugal
