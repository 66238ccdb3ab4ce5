// Logging that keeps mpirun output readable: rank 0 prints unless asked otherwise.
#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace frugal {

namespace {
int g_rank = 0;
bool g_all_ranks = std::getenv("FRUGAL_LOG_ALL_RANKS") != nullptr;
bool g_quiet = false;
}  // namespace

std::string format_bytes(size_t bytes) {
  std::ostringstream out;
  out.precision(3);
  if (bytes >= (size_t(1) << 30))
    out << double(bytes) / double(size_t(1) << 30) << " GiB";
  else if (bytes >= (size_t(1) << 20))
    out << double(bytes) / double(size_t(1) << 20) << " MiB";
  else
    out << bytes << " B";
  return out.str();
}

void set_log_rank(int rank) { g_rank = rank; }
void set_log_all_ranks(bool all) { g_all_ranks = all; }
void set_log_quiet(bool quiet) { g_quiet = quiet; }

void log_line(const std::string& line) {
  if (g_quiet || (g_rank != 0 && !g_all_ranks)) return;
  if (g_all_ranks)
    std::printf("[rank %d] %s\n", g_rank, line.c_str());
  else
    std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void warn_line(const std::string& line) {
  std::fprintf(stderr, "frugal: warning: [rank %d] %s\n", g_rank, line.c_str());
  std::fflush(stderr);
}

}  // namespace frugal
