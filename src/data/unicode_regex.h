// A compiled PCRE2 regular expression over UTF-8 with Unicode properties (\p{L}, \p{N}, \s as
// Unicode White_Space, case-insensitive groups by Unicode case folding), JIT-compiled where
// the platform allows: the pre-tokenizer Split patterns of tokenizer.json files.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace frugal {

class UnicodeRegex {
 public:
  // Throws Error naming `what` (e.g. "tokenizer.json: pre_tokenizer Split pattern") and the
  // offset of the problem when the pattern does not compile.
  UnicodeRegex(const std::string& pattern, const std::string& what);
  ~UnicodeRegex();
  UnicodeRegex(UnicodeRegex&&) noexcept;
  UnicodeRegex& operator=(UnicodeRegex&&) noexcept;
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  // [begin, end) byte ranges of the successive non-overlapping matches in `text`, which must be
  // valid UTF-8 (not checked again), each search starting where the last match ended. An empty
  // match splits nothing: the search moves on by one character. Thread-safe.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::string what_;
  void* code_ = nullptr;  // pcre2_code_8, kept out of this header
  bool jit_ = false;
};

}  // namespace frugal
