// Logging that keeps mpirun output readable: rank 0 prints unless asked otherwise.
#include "core/log.h"

#include <cctype>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
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

size_t parse_bytes(const std::string& text, const std::string& key) {
  auto bad = [&]() -> size_t {
    fail("config key '", key, "': '", text,
         "' is not a size (a number with an optional unit: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  };
  size_t used = 0;
  double number = 0;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    return bad();
  }
  std::string unit;
  for (size_t i = used; i < text.size(); ++i)
    if (text[i] != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  static const std::pair<const char*, double> units[] = {
      {"", 1},           {"b", 1},          {"kib", 1024.0},   {"mib", 1048576.0},
      {"gib", 1073741824.0}, {"tib", 1099511627776.0}, {"kb", 1e3}, {"mb", 1e6},
      {"gb", 1e9},       {"tb", 1e12}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      if (!(number >= 0) || number * scale > 1e18) return bad();
      return static_cast<size_t>(number * scale + 0.5);
    }
  return bad();
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
