// Leftmost-longest matching of added tokens in text.
#include "data/added_tokens.h"

#include <algorithm>

namespace frugal {

void AddedTokenMatcher::add(const std::string& content, int32_t id) {
  if (content.empty()) return;  // matches nothing in HF either
  tokens_.emplace_back(content, id);
  auto& bucket = by_first_byte_[static_cast<unsigned char>(content[0])];
  bucket.push_back(tokens_.size() - 1);
  std::stable_sort(bucket.begin(), bucket.end(), [&](size_t a, size_t b) {
    return tokens_[a].first.size() > tokens_[b].first.size();
  });
}

std::vector<AddedTokenMatcher::Segment> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<Segment> segments;
  size_t plain_begin = 0;
  for (size_t pos = 0; pos < text.size();) {
    const int32_t* found = nullptr;
    size_t found_length = 0;
    for (size_t index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const auto& [content, id] = tokens_[index];
      if (text.compare(pos, content.size(), content) == 0) {
        found = &id, found_length = content.size();
        break;  // longest first
      }
    }
    if (!found) {
      ++pos;
      continue;
    }
    if (plain_begin < pos) segments.push_back({plain_begin, pos, -1});
    segments.push_back({pos, pos + found_length, *found});
    pos += found_length;
    plain_begin = pos;
  }
  if (plain_begin < text.size()) segments.push_back({plain_begin, text.size(), -1});
  return segments;
}

}  // namespace frugal
