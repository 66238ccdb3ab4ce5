// Text as Hugging Face tokenizers receive it: bytes that are not UTF-8 replaced by U+FFFD the
// way Python's bytes.decode(errors="replace") and Rust's String::from_utf8_lossy do, and the
// Unicode normal form C a tokenizer.json's "NFC" normalizer asks for (utf8proc).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace frugal {

// `bytes` with every maximal ill-formed subpart (Unicode 15, section 3.9, "U+FFFD Substitution
// of Maximal Subparts") replaced by U+FFFD, so "\xE2\x82" + "A" gives one U+FFFD then "A", and
// "\xC0\xAF" (overlong) two. Valid UTF-8 comes back unchanged.
std::string replace_invalid_utf8(std::string_view bytes);

// The NFC form of valid UTF-8 text (canonical decomposition, then canonical composition).
std::string nfc_normalize(std::string_view utf8);

// Valid UTF-8 text in NFC, with the way back to the original's byte offsets. NFC of a text is
// the NFC of its pieces cut before each ASCII character (none is ever the second of a canonical
// composition, and reordering stops at it, a starter), so only the pieces that hold other
// characters are normalized, and offsets outside the pieces NFC changed map exactly.
class NfcText {
 public:
  explicit NfcText(std::string_view original);
  const std::string& text() const { return text_; }
  // The original offset of the normalized offset `n` as the start of a range: inside a piece NFC
  // changed, that piece's start.
  size_t original_begin(size_t n) const;
  // The same as the end of a range: inside a piece NFC changed, that piece's end.
  size_t original_end(size_t n) const;

 private:
  struct ChangedPiece {
    size_t original_begin, original_end, normalized_begin, normalized_end;
  };
  std::string text_;
  std::vector<ChangedPiece> changed_;  // in order
};

// Appends code point `cp` (at most U+10FFFF) to `out` as UTF-8.
void append_utf8(std::string& out, char32_t cp);

}  // namespace frugal
