// Text as Hugging Face tokenizers receive it: bytes that are not UTF-8 replaced by U+FFFD the
// way Python's bytes.decode(errors="replace") and Rust's String::from_utf8_lossy do, and the
// Unicode normal form C a tokenizer.json's "NFC" normalizer asks for (utf8proc).
#pragma once

#include <string>
#include <string_view>

namespace frugal {

// `bytes` with every maximal ill-formed subpart (Unicode 15, section 3.9, "U+FFFD Substitution
// of Maximal Subparts") replaced by U+FFFD, so "\xE2\x82" + "A" gives one U+FFFD then "A", and
// "\xC0\xAF" (overlong) two. Valid UTF-8 comes back unchanged.
std::string replace_invalid_utf8(std::string_view bytes);

// The NFC form of valid UTF-8 text (canonical decomposition, then canonical composition).
std::string nfc_normalize(std::string_view utf8);

// Appends code point `cp` (at most U+10FFFF) to `out` as UTF-8.
void append_utf8(std::string& out, char32_t cp);

}  // namespace frugal
