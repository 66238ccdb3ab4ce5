#include "data/text_stream.h"

#include <utility>

namespace frugal {

namespace {
const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}
}  // namespace

TextStream::TextStream(Decode decode, std::vector<int32_t> prompt)
    : decode_(std::move(decode)), tokens_(std::move(prompt)) {}

std::string TextStream::start() { return advance(false); }

std::string TextStream::push(int32_t token) {
  tokens_.push_back(token);
  return advance(false);
}

std::string TextStream::advance(bool last) {
  const std::string text = decode_(tokens_);
  if (!last && ends_with(text, kReplacement)) return "";  // perhaps an incomplete character
  if (text.compare(0, printed_.size(), printed_) != 0) return "";  // not an extension
  std::string added = text.substr(printed_.size());
  printed_ = text;
  return added;
}

std::string TextStream::finish() {
  std::string rest = advance(true);
  const std::string text = decode_(tokens_);
  if (text != printed_) rest += "\n" + text;
  return rest;
}

}  // namespace frugal
