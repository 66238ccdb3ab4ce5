// The trainer's small decisions as functions: which configuration keys differ between ranks,
// which metrics.jsonl records a resumed run keeps, the fault-injection switch, and the stop
// signals.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

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
  // A line cut short between whole records (a file an older frugal appended to after a crash):
  // it goes, and the records around it stay, in order.
  std::ofstream(path)
      << "{\"step\":0,\"val_loss\":5.5}\n{\"step\":1,\"lo\n{\"step\":1,\"loss\":5.2}\n"
         "{\"step\":2,\"loss\":4.9}\n";
  truncate_metrics(path, 1);
  CHECK(read_all(path) == "{\"step\":0,\"val_loss\":5.5}\n{\"step\":1,\"loss\":5.2}\n");
  CHECK(!std::filesystem::exists(path + ".tmp"));
}

namespace {

// RLIMIT_FSIZE for the scope: a write past `bytes` of any file fails (EFBIG, SIGXFSZ ignored)
// at whatever byte it reaches, as a full disk fails it, with no privileges needed.
struct FileSizeLimit {
  rlimit old = {};
  struct sigaction old_action = {};
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    REQUIRE(sigaction(SIGXFSZ, &ignore, &old_action) == 0);
    rlimit limit = old;
    limit.rlim_cur = bytes;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &limit) == 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old);
    sigaction(SIGXFSZ, &old_action, nullptr);
  }
};

// Every line of `text` a whole JSON object, the last one ended by its newline; their steps.
std::vector<int64_t> whole_records(const std::string& text) {
  std::vector<int64_t> steps;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    if (!r.is_object()) return {-1};
    steps.push_back(r.value("step", int64_t(-1)));
  }
  if (!text.empty() && text.back() != '\n') steps.push_back(-2);
  return steps;
}

// Runs `f` in a child process that SIGALRM ends after 10 s: its exit status, or 128 + the
// signal that ended it (a hang gives 128 + SIGALRM instead of a test that never returns).
int in_child(const std::function<int()>& f) {
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    alarm(10);
    _exit(f());
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("metrics on a full disk: resuming keeps every record up to its step", "[train]") {
  TempDir tmp;
  const std::string path = tmp.file("metrics.jsonl");
  std::string records;
  for (int step = 0; step <= 40; ++step)
    records += "{\"step\":" + std::to_string(step) + ",\"loss\":4.5,\"lr\":0.001}\n";
  std::ofstream(path) << records << "{\"step\":41,\"loss\"";
  const size_t kept_bytes = records.find("{\"step\":16,");
  {
    // Room for less than the records kept: dropping the tail must not need a copy of them.
    FileSizeLimit limit(kept_bytes / 2);
    truncate_metrics(path, 15);
  }
  CHECK(read_all(path) == records.substr(0, kept_bytes));
  // A file whose kept records must be rewritten (a cut line among them) on a disk without room
  // for the new file: an Error naming it, and the file as it was.
  const std::string mixed = "{\"step\":0,\"val_loss\":5.5}\n{\"st\n" + records.substr(kept_bytes);
  std::ofstream(path) << mixed;
  std::string error;
  {
    FileSizeLimit limit(64);
    error = error_of([&] { truncate_metrics(path, 30); });
  }
  CHECK(contains(error, "cannot write '" + path + "'"));
  CHECK(contains(error, "it is unchanged"));
  CHECK(read_all(path) == mixed);
  CHECK(!std::filesystem::exists(path + ".tmp"));
}

TEST_CASE("metrics on a full disk: a failed write is named and leaves whole records", "[train]") {
  TempDir tmp;
  const std::string path = tmp.file("metrics.jsonl");
  std::string error;
  int64_t written = 0;
  {
    MetricsWriter metrics(path, false);
    FileSizeLimit limit(1000);  // room for a few records and part of the next
    error = error_of([&] {
      for (int64_t step = 0; step < 100; ++step, ++written)
        metrics.write({{"step", step}, {"loss", 4.25}, {"note", std::string(90, 'x')}});
    });
  }
  REQUIRE(written > 2);
  CHECK(contains(error, "cannot write to metrics file '" + path + "'"));
  CHECK(contains(error, "the record of step " + std::to_string(written) + " is not in it"));
  std::vector<int64_t> expected(static_cast<size_t>(written));
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(whole_records(read_all(path)) == expected);
  // Appended to after a resume, the file goes on from its last whole record.
  MetricsWriter resumed(path, true);
  resumed.write({{"step", written}, {"loss", 4.0}});
  expected.push_back(written);
  CHECK(whole_records(read_all(path)) == expected);
}

TEST_CASE("metrics: a FIFO or a directory in its place is refused by name, without waiting",
          "[train]") {
  TempDir tmp;
  const std::string fifo = tmp.file("metrics.jsonl");
  REQUIRE(mkfifo(fifo.c_str(), 0644) == 0);
  const auto refused = [](const std::function<void()>& f, const std::string& path) {
    return [f, path] {
      return contains(error_of(f), "metrics file '" + path + "' is not a regular file") ? 0 : 1;
    };
  };
  CHECK(in_child(refused([&] { MetricsWriter(fifo, true); }, fifo)) == 0);
  CHECK(in_child(refused([&] { MetricsWriter(fifo, false); }, fifo)) == 0);
  CHECK(in_child(refused([&] { truncate_metrics(fifo, 3); }, fifo)) == 0);
  const std::string dir = tmp.file("dir.jsonl");
  std::filesystem::create_directory(dir);
  CHECK(in_child(refused([&] { truncate_metrics(dir, 3); }, dir)) == 0);
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
