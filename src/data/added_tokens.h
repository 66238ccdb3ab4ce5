// Special and added tokens found in text before anything else is tokenized, as Hugging Face
// tokenizers does: leftmost-longest matches of the tokens' strings (its Aho-Corasick trie).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace frugal {

class AddedTokenMatcher {
 public:
  struct Segment {
    size_t begin, end;
    int32_t id;  // -1: plain text
  };
  void add(const std::string& content, int32_t id);
  bool empty() const { return tokens_.empty(); }
  // `text` cut into plain-text segments and added-token matches, in order.
  std::vector<Segment> split(std::string_view text) const;

 private:
  std::vector<std::pair<std::string, int32_t>> tokens_;
  std::vector<size_t> by_first_byte_[256];  // indexes into tokens_, longest first
};

}  // namespace frugal
