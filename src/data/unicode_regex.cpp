// PCRE2 behind UnicodeRegex: compiled once, matched with per-call match data (thread-safe).
#include "data/unicode_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "core/error.h"

namespace frugal {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0)
    return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

}  // namespace

UnicodeRegex::UnicodeRegex(const std::string& pattern, const std::string& what)
    : pattern_(pattern), what_(what) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UTF: the pattern and subjects are UTF-8. UCP: \s, \d, \w and POSIX classes by Unicode
  // properties, as Oniguruma (the engine of HF tokenizers) has them.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!code)
    fail(what, " '", pattern, "' does not compile (PCRE2, at offset ", offset,
         "): ", pcre2_message(error));
  code_ = code;
  // Without JIT support (some platforms) the interpreter gives the same matches, slower.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

UnicodeRegex::~UnicodeRegex() {
  if (code_) pcre2_code_free(as_code(code_));
}

UnicodeRegex::UnicodeRegex(UnicodeRegex&& other) noexcept
    : pattern_(std::move(other.pattern_)),
      what_(std::move(other.what_)),
      code_(std::exchange(other.code_, nullptr)),
      jit_(other.jit_) {}

UnicodeRegex& UnicodeRegex::operator=(UnicodeRegex&& other) noexcept {
  if (this != &other) {
    if (code_) pcre2_code_free(as_code(code_));
    pattern_ = std::move(other.pattern_);
    what_ = std::move(other.what_);
    code_ = std::exchange(other.code_, nullptr);
    jit_ = other.jit_;
  }
  return *this;
}

std::vector<std::pair<size_t, size_t>> UnicodeRegex::find_all(std::string_view text) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(as_code(code_), nullptr), &pcre2_match_data_free);
  if (!match) fail(what_, ": out of memory for PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::vector<std::pair<size_t, size_t>> found;
  size_t start = 0;
  while (start <= text.size()) {
    // NO_UTF_CHECK: the caller gives valid UTF-8; checking again from `start` on every call
    // would make a long line quadratic.
    int rc = pcre2_match(as_code(code_), subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                         match.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking on the heap
      rc = pcre2_match(as_code(code_), subject, text.size(), start,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      fail(what_, " '", pattern_, "': matching a text of ", text.size(),
           " bytes failed: ", pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      found.emplace_back(begin, end);
      start = end;
    } else {
      // An empty match: step over one UTF-8 character.
      start = begin + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
        ++start;
    }
  }
  return found;
}

}  // namespace frugal
