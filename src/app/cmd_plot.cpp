// `frugal plot RUN_DIR [--out DIR]`: PNGs of a run's metrics.jsonl drawn by gnuplot (a Debian
// package, run as a program): loss and validation loss, tokens/s, memory, health.
#include <boost/program_options.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "app/commands.h"
#include "app/options.h"
#include "core/error.h"
#include "monitor/plots.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace frugal {

namespace {

// gnuplot on PATH, or a clear error saying how to get it.
std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t begin = 0;
  while (begin <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', begin), dirs.size());
    const fs::path candidate = fs::path(dirs.substr(begin, end - begin)) / "gnuplot";
    std::error_code ec;
    if (!candidate.parent_path().empty() && fs::is_regular_file(candidate, ec)) return candidate;
    begin = end + 1;
  }
  fail(
      "plot: gnuplot is not installed (on PATH); install the Debian package gnuplot-nox "
      "(tools/install-deps does), then run frugal plot again");
}

// Single quotes for the shell.
std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

int cmd_plot(const std::vector<std::string>& args) {
  po::options_description options("frugal plot RUN_DIR [options]");
  std::string run_dir, out_dir;
  options.add_options()("help,h", "this help")("out", po::value(&out_dir),
                                               "where the PNGs go (default: RUN_DIR/plots)");
  po::options_description hidden;
  hidden.add_options()("run-dir", po::value(&run_dir));
  po::options_description all;
  all.add(options).add(hidden);
  po::positional_options_description positional;
  positional.add("run-dir", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    fail("plot: ", program_options_message(e), " (see 'frugal plot --help')");
  }
  if (vm.count("help")) {
    std::cout << options << "\nWrites loss.png, throughput.png, memory.png and health.png from "
              << "RUN_DIR/metrics.jsonl with gnuplot.\n";
    return 0;
  }
  if (run_dir.empty()) fail("plot: give the run directory (train.out_dir): frugal plot RUN_DIR");
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  if (!fs::exists(metrics))
    fail("plot: '", run_dir, "' has no metrics.jsonl (is it a train.out_dir?)");
  if (out_dir.empty()) out_dir = (fs::path(run_dir) / "plots").string();
  const std::string gnuplot = find_gnuplot();
  const std::vector<std::string> pngs = write_plot_script(metrics.string(), out_dir);
  const std::string command =
      "cd " + shell_quoted(out_dir) + " && " + shell_quoted(gnuplot) + " plots.gp";
  if (std::system(command.c_str()) != 0)
    fail("plot: gnuplot failed on '", (fs::path(out_dir) / "plots.gp").string(), "'");
  for (const std::string& png : pngs) std::cout << (fs::path(out_dir) / png).string() << "\n";
  return 0;
}

}  // namespace frugal
