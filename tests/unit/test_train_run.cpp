// The trainer's small decisions as functions: which configuration keys differ between ranks,
// which metrics.jsonl records a resumed run keeps, the fault-injection switch, and the stop
// signals.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "catch_compat.h"
#include "monitor/metrics.h"
#include "test_support.h"
#include "train/fault_injection.h"
#include "train/same_config.h"
#include "train/stop_signals.h"

using namespace frugal;
using namespace frugal::test;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("config agreement: every differing or absent key, named with both values", "[train]") {
  const std::map<std::string, std::string> rank0 = {
      {"train.lr", "0.003"}, {"train.seed", "1234"}, {"parallel.cp", "1"}};
  CHECK(config_differences(rank0, rank0, "rank 0").empty());
  std::map<std::string, std::string> mine = rank0;
  mine["train.seed"] = "99";
  mine["train.new_key"] = "1";
  CHECK(config_differences(mine, rank0, "rank 0") ==
        " train.new_key = '1' (rank 0: '(absent)'); train.seed = '99' (rank 0: '1234');");
  CHECK(config_differences(rank0, mine, "checkpoint") ==
        " train.seed = '1234' (checkpoint: '99');");
}

TEST_CASE("metrics truncation: records after the resumed step go, and cut lines", "[train]") {
  TempDir tmp;
  const std::string path = tmp.file("metrics.jsonl");
  std::ofstream(path) << "{\"step\":0,\"val_loss\":5.5}\n"
                         "{\"step\":1,\"loss\":5.1}\n"
                         "{\"step\":2,\"loss\":4.9}\n"
                         "{\"step\":3,\"loss\":4.7}\n"
                         "{\"step\":4,\"lo";  // cut by a crash
  truncate_metrics(path, 2);
  CHECK(read_all(path) ==
        "{\"step\":0,\"val_loss\":5.5}\n{\"step\":1,\"loss\":5.1}\n{\"step\":2,\"loss\":4.9}\n");
  truncate_metrics(path, 0);
  CHECK(read_all(path) == "{\"step\":0,\"val_loss\":5.5}\n");
  truncate_metrics(tmp.file("absent.jsonl"), 3);  // nothing to do
  CHECK(!std::filesystem::exists(tmp.file("absent.jsonl")));
}

TEST_CASE("fault injection: parsed once, malformed values named", "[train]") {
  CHECK(parse_fault_injection(nullptr).kind == FaultInjection::Kind::none);
  CHECK(parse_fault_injection("").kind == FaultInjection::Kind::none);
  const FaultInjection exit = parse_fault_injection("exit:1:7");
  CHECK(exit.kind == FaultInjection::Kind::exit);
  CHECK(exit.rank == 1);
  CHECK(exit.step == 7);
  const FaultInjection hang = parse_fault_injection("hang:0:21");
  CHECK(hang.kind == FaultInjection::Kind::hang);
  CHECK(hang.step == 21);
  for (const char* bad : {"exit", "exit:1", "crash:1:2", "exit:1:2x", "exit:-1:3", "hang:0:0"})
    CHECK(contains(error_of([&] { parse_fault_injection(bad); }), "FRUGAL_INJECT_FAULT is '"));
  // A fault for another rank or step does nothing (this process goes on).
  inject_fault(exit, 0, 7);
  inject_fault(exit, 1, 6);
}

TEST_CASE("stop signals: recorded by the handler, the first one named", "[train]") {
  const FaultInjection signal = parse_fault_injection("signal:1:4");
  CHECK(signal.kind == FaultInjection::Kind::signal);
  CHECK(signal.rank == 1);
  CHECK(signal.step == 4);
  const std::atomic<int>& received = install_stop_signal_handlers();
  CHECK(received.load() == 0);
  inject_fault(signal, 0, 4);  // another rank's: nothing happens
  CHECK(received.load() == 0);
  inject_fault(signal, 1, 4);  // raises SIGUSR1 in this process, which goes on
  CHECK(received.load() == SIGUSR1);
  std::raise(SIGTERM);  // a second signal (one during the save, say) changes nothing
  CHECK(received.load() == SIGUSR1);
  CHECK(signal_name(SIGUSR1) == "SIGUSR1");
  CHECK(signal_name(SIGTERM) == "SIGTERM");
  CHECK(signal_name(SIGINT) == "SIGINT");
  CHECK(signal_name(SIGHUP) == "signal " + std::to_string(SIGHUP));
}

TEST_CASE(
    "Ctrl-C: a first SIGINT asks for a stop, the same one delivered twice changes nothing, "
    "a second press ends the process",
    "[train]") {
  // In a child process: the last SIGINT must end it, and the handler's state is per process.
  // The child writes to `survived` once the duplicate has left it running.
  int survived[2];
  REQUIRE(pipe(survived) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(survived[0]);
    struct sigaction set = {}, now = {};
    set.sa_handler = SIG_DFL;
    sigaction(SIGINT, &set, nullptr);
    const std::atomic<int>& received = install_stop_signal_handlers();
    const int before = received.load();  // the first signal is named: an earlier test's, if any
    std::raise(SIGINT);                  // recorded; this process goes on
    if (received.load() != (before != 0 ? before : SIGINT)) _exit(1);
    std::raise(SIGINT);  // the same Ctrl-C again at once (to the process, then to its group)
    sigaction(SIGINT, nullptr, &now);
    if (now.sa_handler == SIG_DFL) _exit(2);
    if (write(survived[1], "d", 1) != 1) _exit(4);
    usleep(700'000);     // a person pressing Ctrl-C again
    std::raise(SIGINT);  // ends the process
    _exit(3);
  }
  close(survived[1]);
  char mark = 0;
  const ssize_t got = read(survived[0], &mark, 1);
  close(survived[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(got == 1);  // the process outlived the same Ctrl-C delivered twice
  INFO("child exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  CHECK(WIFSIGNALED(status));
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGINT));
  // Ignored when the program started (a background job of a script): it stays ignored.
  struct sigaction set = {}, now = {};
  set.sa_handler = SIG_IGN;
  sigaction(SIGINT, &set, nullptr);
  install_stop_signal_handlers();
  sigaction(SIGINT, nullptr, &now);
  CHECK(now.sa_handler == SIG_IGN);
  set.sa_handler = SIG_DFL;
  sigaction(SIGINT, &set, nullptr);
}
