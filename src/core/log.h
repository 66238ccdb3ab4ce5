// Logging: rank 0 prints, other ranks stay quiet unless asked (FRUGAL_LOG_ALL_RANKS=1 or
// set_log_all_ranks), so mpirun output stays readable.
#pragma once

#include <cstddef>
#include <string>

#include "core/error.h"

namespace frugal {

void set_log_rank(int rank);       // called once after MPI starts
void set_log_all_ranks(bool all);  // every rank prints, prefixed with [rank N]
void set_log_quiet(bool quiet);    // info lines suppressed (warnings and errors stay)

// "1.5 GiB", "12 MiB", "512 B": sizes in messages.
std::string format_bytes(size_t bytes);
// "24GiB", "512 MiB", "1.5GB", "1000000" (bytes): binary (KiB, MiB, GiB, TiB) and decimal (KB,
// MB, GB, TB) units, case-insensitive. Throws Error naming `key` for anything else.
size_t parse_bytes(const std::string& text, const std::string& key);

void log_line(const std::string& line);   // info, to stdout
void warn_line(const std::string& line);  // "frugal: warning: ...", to stderr, every rank

template <class... Parts>
void log_info(const Parts&... parts) {
  log_line(detail::concat(parts...));
}
template <class... Parts>
void log_warn(const Parts&... parts) {
  warn_line(detail::concat(parts...));
}

}  // namespace frugal
