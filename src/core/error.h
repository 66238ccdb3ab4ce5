// Errors: one exception type for everything a user can cause (bad config, bad file, bad shape),
// and FRUGAL_CHECK for internal invariants, which names the values involved.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace frugal {

// Thrown for anything the user can fix; main() prints "frugal: <what>" and exits non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

// Text read from a file, fit to quote in a message: bytes outside printable ASCII as \xNN, and
// cut after `max` bytes with "..." (a binary file's bytes would garble the message, and its
// first NUL end it).
inline std::string printable(const std::string& text, size_t max = 40) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < text.size() && i < max; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f) {
      out += static_cast<char>(byte);
    } else {
      out += "\\x";
      out += digits[byte >> 4];
      out += digits[byte & 15];
    }
  }
  if (text.size() > max) out += "...";
  return out;
}

// fail("config key '", key, "': value '", v, "' is not a number")
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(detail::concat(parts...));
}

}  // namespace frugal

// An invariant that must hold; the message says which values broke it and where.
#define FRUGAL_CHECK(cond, ...)                                                       \
  do {                                                                                \
    if (!(cond))                                                                      \
      ::frugal::fail("internal check failed: ", #cond, " (", __FILE__, ":", __LINE__, \
                     ") " __VA_OPT__(, ) __VA_ARGS__);                                \
  } while (0)
