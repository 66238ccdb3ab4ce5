// BackgroundUpdates: the units are updated in order on another thread, a wait returns once its
// unit is done (not the later ones), and an error reaches the caller.
#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <vector>

#include "catch_compat.h"
#include "optim/background_updates.h"

using frugal::BackgroundUpdates;
using namespace std::chrono_literals;

TEST_CASE("background updates run in unit order beside the caller", "[optim]") {
  BackgroundUpdates updates;
  std::vector<size_t> order;  // written by the update thread only, read after a wait
  std::promise<void> release_unit_2;
  std::shared_future<void> released = release_unit_2.get_future().share();
  std::atomic<bool> unit_2_waited_in_vain{false};
  updates.start(5, [&](size_t u) {
    // Unit 2 waits for the caller: a start() that ran the updates itself would time out here.
    if (u == 2 && released.wait_for(10s) != std::future_status::ready) unit_2_waited_in_vain = true;
    order.push_back(u);
  });
  updates.wait(1);
  CHECK(order == std::vector<size_t>{0, 1});  // unit 2 cannot be done: it waits for us
  release_unit_2.set_value();
  updates.wait(3);  // (order is not read here: unit 4 may be writing it)
  updates.wait_all();
  CHECK(order == std::vector<size_t>{0, 1, 2, 3, 4});
  CHECK_FALSE(unit_2_waited_in_vain);
  updates.wait(7);  // past the units, and nothing running: returns at once
  updates.wait_all();

  SECTION("a new run starts after the previous one") {
    updates.start(3, [&](size_t u) { order.push_back(10 + u); });
    updates.start(2, [&](size_t u) { order.push_back(20 + u); });
    updates.wait_all();
    CHECK(order == std::vector<size_t>{0, 1, 2, 3, 4, 10, 11, 12, 20, 21});
  }
}

TEST_CASE("an error of a background update reaches the caller once", "[optim]") {
  BackgroundUpdates updates;
  std::vector<size_t> done;
  updates.start(6, [&](size_t u) {
    if (u == 2) throw std::runtime_error("unit 2 failed");
    done.push_back(u);
  });
  updates.wait(1);  // units before the failing one are fine
  try {
    updates.wait(4);
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "unit 2 failed");
  }
  CHECK(done == std::vector<size_t>{0, 1});  // the run stopped at the error
  updates.wait(5);                           // the error was handed over: nothing left
  updates.wait_all();

  SECTION("wait_all rethrows it too") {
    updates.start(3, [&](size_t u) {
      if (u == 0) throw std::runtime_error("unit 0 failed");
    });
    REQUIRE_THROWS_AS(updates.wait_all(), std::runtime_error);
  }
  SECTION("and so does the next start") {
    updates.start(3, [&](size_t u) {
      if (u == 1) throw std::runtime_error("unit 1 failed");
    });
    REQUIRE_THROWS_AS(updates.start(1, [](size_t) {}), std::runtime_error);
    updates.wait_all();
  }
}
