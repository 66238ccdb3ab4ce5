// data/text_stream.h: what `frugal generate` prints as the sequence grows adds up to the
// decoding of the whole sequence, holding back a character that later tokens complete.
#include <cctype>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "data/text_stream.h"

using namespace frugal;

namespace {
// A tokenizer's decoding, written out: ids 1..3 are words, 100, 101 and 102 the three bytes
// of "€" (E2 82 AC) with byte fallback, which decode as U+FFFD until the character is whole.
// Id 9 capitalises the whole text (a decoding whose prefix is not the whole's prefix).
std::string decode(const std::vector<int32_t>& ids) {
  const char* words[] = {"", "The", " cat", " sat"};
  std::string text, bytes;
  bool capital = false;
  for (int32_t id : ids) {
    if (id >= 100) {
      bytes += std::string(1, "\xE2\x82\xAC"[id - 100]);
      if (bytes.size() == 3) text += bytes, bytes.clear();
      continue;
    }
    if (!bytes.empty()) text += "\xEF\xBF\xBD", bytes.clear();  // an incomplete one, for good
    if (id == 9) capital = true;
    else text += words[id];
  }
  if (!bytes.empty()) text += "\xEF\xBF\xBD";
  if (capital) for (char& c : text) c = char(std::toupper(static_cast<unsigned char>(c)));
  return text;
}
}  // namespace

TEST_CASE("text stream: the printed pieces add up to the whole decoding", "[data]") {
  TextStream stream(decode, {1});
  std::string out = stream.start();
  CHECK(out == "The");
  CHECK(stream.push(2) == " cat");
  CHECK(stream.push(100).empty());  // an incomplete character: held
  CHECK(stream.push(101).empty());
  CHECK(stream.push(102) == "\xE2\x82\xAC");  // whole: printed
  out += " cat\xE2\x82\xAC";
  CHECK(stream.push(3) == " sat");
  out += " sat";
  CHECK(stream.push(100).empty());
  out += stream.finish();  // at the end the U+FFFD stays: it is the decoding
  CHECK(out == decode({1, 2, 100, 101, 102, 3, 100}));
  CHECK(stream.tokens() == std::vector<int32_t>{1, 2, 100, 101, 102, 3, 100});
}

TEST_CASE("text stream: a decoding that rewrites its start ends with the whole text on a line",
          "[data]") {
  TextStream stream(decode, {1});
  std::string out = stream.start() + stream.push(2);
  CHECK(stream.push(9).empty());  // "THE CAT" does not extend "The cat": nothing more printed
  out += stream.finish();
  CHECK(out == "The cat\nTHE CAT");
}
