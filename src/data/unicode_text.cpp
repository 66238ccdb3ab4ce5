// UTF-8 repair by maximal subparts, and NFC through utf8proc.
#include "data/unicode_text.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace frugal {

namespace {

// The well-formed byte sequences (Unicode Table 3-7): after a lead byte, the range the
// second byte must be in (the rest are 80..BF), and how many bytes follow. A lead byte
// outside these (80..C1, F5..FF) is ill-formed on its own.
struct LeadByte {
  int following = -1;  // -1: not a lead byte
  unsigned char second_lo = 0x80, second_hi = 0xBF;
};

LeadByte lead_byte(unsigned char c) {
  if (c >= 0xC2 && c <= 0xDF) return {1};
  if (c == 0xE0) return {2, 0xA0, 0xBF};
  if (c == 0xED) return {2, 0x80, 0x9F};  // not the UTF-16 surrogates D800..DFFF
  if (c >= 0xE1 && c <= 0xEF) return {2};
  if (c == 0xF0) return {3, 0x90, 0xBF};
  if (c >= 0xF1 && c <= 0xF3) return {3};
  if (c == 0xF4) return {3, 0x80, 0x8F};  // not past U+10FFFF
  return {};
}

}  // namespace

std::string replace_invalid_utf8(std::string_view bytes) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      out.push_back(static_cast<char>(s[i++]));
      continue;
    }
    const LeadByte lead = lead_byte(s[i]);
    if (lead.following < 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    // Count the continuation bytes that keep the sequence well-formed so far.
    int valid = 0;
    while (valid < lead.following && i + 1 + valid < n) {
      const unsigned char c = s[i + 1 + valid];
      const bool ok =
          valid == 0 ? (c >= lead.second_lo && c <= lead.second_hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++valid;
    }
    if (valid == lead.following) {
      out.append(bytes.substr(i, 1 + valid));
    } else {
      out += kReplacement;  // one for the whole maximal subpart
    }
    i += 1 + valid;
  }
  return out;
}

std::string nfc_normalize(std::string_view utf8) {
  // Plain ASCII is its own normal form: skip the library for the common case.
  bool ascii = true;
  for (char c : utf8) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(utf8);
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                   static_cast<utf8proc_ssize_t>(utf8.size()), &result,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) fail("NFC normalization failed: ", utf8proc_errmsg(length));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, &std::free);
  return std::string(reinterpret_cast<const char*>(result), static_cast<size_t>(length));
}

NfcText::NfcText(std::string_view original) {
  text_.reserve(original.size());
  size_t copied = 0;  // original bytes before this are in text_
  for (size_t i = 0; i < original.size();) {
    if (static_cast<unsigned char>(original[i]) < 0x80) {
      ++i;
      continue;
    }
    // A run of non-ASCII bytes, with the ASCII character before it (which may compose with
    // a combining mark that follows, as e + U+0301).
    size_t end = i;
    while (end < original.size() && static_cast<unsigned char>(original[end]) >= 0x80) ++end;
    const size_t begin = i > copied ? i - 1 : i;
    text_.append(original.substr(copied, begin - copied));
    const std::string_view piece = original.substr(begin, end - begin);
    const std::string normalized = nfc_normalize(piece);
    if (normalized != piece)
      changed_.push_back({begin, end, text_.size(), text_.size() + normalized.size()});
    text_ += normalized;
    copied = i = end;
  }
  text_.append(original.substr(copied));
}

size_t NfcText::original_begin(size_t n) const {
  // The last changed piece that starts at or before n.
  auto it =
      std::upper_bound(changed_.begin(), changed_.end(), n,
                       [](size_t v, const ChangedPiece& p) { return v < p.normalized_begin; });
  if (it == changed_.begin()) return n;
  const ChangedPiece& p = *std::prev(it);
  if (n < p.normalized_end) return p.original_begin;
  return p.original_end + (n - p.normalized_end);
}

size_t NfcText::original_end(size_t n) const {
  // The last changed piece that starts before n.
  auto it =
      std::lower_bound(changed_.begin(), changed_.end(), n,
                       [](const ChangedPiece& p, size_t v) { return p.normalized_begin < v; });
  if (it == changed_.begin()) return n;
  const ChangedPiece& p = *std::prev(it);
  if (n <= p.normalized_end) return p.original_end;
  return p.original_end + (n - p.normalized_end);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace frugal
