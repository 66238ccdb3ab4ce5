// The lock on train.out_dir: a second process is refused by name (the directory, the holder's
// pid and host), a clean end or a dead holder frees it, and a lock file that is not a regular
// file is refused without waiting. Each contender is a child of fork(), as another run is another
// process.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "catch_compat.h"
#include "test_support.h"
#include "train/run_dir_lock.h"

using namespace frugal;
using namespace frugal::test;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string this_host() {
  char name[256] = {};
  REQUIRE(gethostname(name, sizeof name - 1) == 0);
  return name;
}

// Runs `f` in a child process (SIGALRM ends it after 10 s, so a wait cannot hang the test) and
// returns what it wrote to its pipe, and its exit status (128 + the signal that ended it).
std::pair<std::string, int> in_child(const std::function<std::string()>& f) {
  int out[2];
  REQUIRE(pipe(out) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(out[0]);
    alarm(10);
    const std::string text = f();
    if (write(out[1], text.data(), text.size()) != ssize_t(text.size())) _exit(2);
    _exit(0);
  }
  close(out[1]);
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) text.append(buffer, size_t(n));
  close(out[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  return {text, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
}

// A child's attempt to lock `dir`: "locked" or the Error's message.
std::pair<std::string, int> try_lock_in_child(const std::string& dir) {
  return in_child([dir] {
    std::string outcome;
    const std::string error = error_of([&] {
      RunDirLock lock(dir);
      outcome = lock.locked() ? "locked" : "not locked";
    });
    return error.empty() ? outcome : error;
  });
}

}  // namespace

TEST_CASE("out_dir lock: a second process is refused by name while the first holds it", "[train]") {
  TempDir tmp;
  const std::string dir = tmp.file("run");  // created by the lock
  {
    RunDirLock lock(dir);
    REQUIRE(lock.locked());
    const nlohmann::json details = nlohmann::json::parse(read_all(lock.path()));
    CHECK(details["pid"] == int64_t(getpid()));
    CHECK(details["host"] == this_host());
    const auto [message, status] = try_lock_in_child(dir);
    CHECK(status == 0);
    INFO(message);
    CHECK(contains(message, "config key 'train.out_dir': '" + dir + "' is in use by another run"));
    CHECK(contains(message, "pid " + std::to_string(getpid()) + " on host " + this_host()));
    CHECK(contains(message, "lock file " + dir + "/train.lock"));
    // The refused process left the holder's details as they were.
    CHECK(nlohmann::json::parse(read_all(lock.path())) == details);
  }
  // Released at a clean end, and emptied: the next run takes it without a word.
  CHECK(read_all(dir + "/train.lock").empty());
  CHECK(try_lock_in_child(dir) == std::make_pair(std::string("locked"), 0));
}

TEST_CASE("out_dir lock: a holder that died frees it, and its details are replaced", "[train]") {
  TempDir tmp;
  const std::string dir = tmp.file("run");
  // A child takes the lock and dies without its destructor (as kill -9 ends a run).
  const auto [text, status] = in_child([dir]() -> std::string {
    new RunDirLock(dir);  // never destroyed
    _exit(7);
  });
  CHECK(status == 7);
  CHECK(read_all(dir + "/train.lock").find("\"pid\"") != std::string::npos);  // its details stay
  RunDirLock lock(dir);
  CHECK(lock.locked());
  CHECK(nlohmann::json::parse(read_all(lock.path()))["pid"] == int64_t(getpid()));
}

TEST_CASE("out_dir lock: a lock file that is not a regular file is refused without waiting",
          "[train]") {
  TempDir tmp;
  const std::string fifo_dir = tmp.file("fifo"), dir_dir = tmp.file("dir");
  std::filesystem::create_directories(fifo_dir);
  REQUIRE(mkfifo((fifo_dir + "/train.lock").c_str(), 0644) == 0);
  std::filesystem::create_directories(dir_dir + "/train.lock");
  for (const std::string& dir : {fifo_dir, dir_dir}) {
    const auto [message, status] = try_lock_in_child(dir);
    CHECK(status == 0);
    CHECK(message == "config key 'train.out_dir': the lock file '" + dir +
                         "/train.lock' is not a regular file");
  }
  std::ofstream(tmp.file("file")) << "x";  // out_dir itself is a file
  CHECK(contains(error_of([&] { RunDirLock lock(tmp.file("file") + "/run"); }),
                 "config key 'train.out_dir': cannot create '" + tmp.file("file") + "/run'"));
}
