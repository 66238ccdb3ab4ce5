// MPI start-up, subcommand dispatch, and the one place errors become messages and exit codes.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>

#include "app/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "ops/ops.h"
#include "train/stop_signals.h"

namespace frugal {

namespace {

struct Command {
  int (*run)(const std::vector<std::string>&);
  const char* summary;
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> table = {
      {"train", {cmd_train, "train a model from a .cfg file (launch ranks with mpirun)"}},
      {"ckpt", {cmd_ckpt, "list a run's checkpoints, or verify every byte of them (checksums)"}},
      {"prepare", {cmd_prepare, "tokenize text, directories or JSONL into train/val token files"}},
      {"eval", {cmd_eval, "mean next-token loss of a model (HF dir or checkpoint) on a file"}},
      {"generate", {cmd_generate, "continue a prompt with a model (greedy or sampled, KV cache)"}},
      {"export", {cmd_export, "write a checkpoint as a Hugging Face directory (safetensors)"}},
      {"plan", {cmd_plan, "predict memory, traffic and step time; pick techniques that fit"}},
      {"plot", {cmd_plot, "PNGs of a run's metrics: loss, tokens/s, memory, health (gnuplot)"}},
  };
  return table;
}

void print_usage() {
  std::printf("usage: frugal <command> [options]   (frugal <command> --help for its options)\n\n");
  for (const auto& [name, command] : commands())
    std::printf("  %-10s %s\n", name.c_str(), command.summary);
  std::printf("\nfrugal %s: trains Llama-family models on hardware too small for them.\n",
              FRUGAL_VERSION);
}

// Ends every rank: a user error on one rank must not leave the others waiting in a
// collective.
[[noreturn]] void abort_all(int code) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  // Without the libraries' exit handlers, as MPI_Abort ends the ranks of a larger run: after a
  // write that failed (a full disk), HDF5's would close the file its failed H5Fclose left half
  // closed, and crash (signal 11 after the message).
  std::fflush(nullptr);
  std::cout.flush();
  std::_Exit(code);
}

}  // namespace

int run_frugal(int argc, char** argv) {
  // `frugal train`'s stop signals are caught from its first instruction, before MPI starts (a
  // second or more under mpirun or srun), so a SIGUSR1 or SIGTERM during start-up stops the run
  // before its first step instead of killing the rank; cmd_train reads the flag.
  if (argc >= 2 && !std::strcmp(argv[1], "train")) install_stop_signal_handlers();
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  set_log_rank(rank);

  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    if (rank == 0) print_usage();
    MPI_Finalize();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    if (rank == 0) std::printf("frugal %s\n", FRUGAL_VERSION);
    MPI_Finalize();
    return 0;
  }
  auto it = commands().find(argv[1]);
  if (it == commands().end()) {
    if (rank == 0) {
      std::fprintf(stderr, "frugal: unknown command '%s'\n\n", argv[1]);
      print_usage();
    }
    MPI_Finalize();
    return 2;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  int code = 0;
  try {
    // Environment switches are read here, once, and handed down; nothing below reads them.
    ops::set_kernel_options(
        ops::kernel_options_from_environment(std::getenv("FRUGAL_ATTENTION_SM90")));
    code = it->second.run(args);
  } catch (const Error& e) {
    std::fprintf(stderr, "frugal: %s\n", e.what());
    std::fflush(stderr);
    abort_all(1);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "frugal: out of host memory\n");
    abort_all(1);
  } catch (const std::filesystem::filesystem_error& e) {
    // An unwritable out_dir, a full disk: the user's to fix, so no "unexpected".
    std::fprintf(stderr, "frugal: %s\n", e.what());
    abort_all(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "frugal: unexpected error: %s\n", e.what());
    abort_all(1);
  }
  MPI_Finalize();
  return code;
}

}  // namespace frugal
