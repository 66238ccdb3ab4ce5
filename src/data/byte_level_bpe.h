// The BPE model of a byte-level tokenizer.json: GPT-2's byte-to-character mapping, a
// vocabulary, and merges applied by rank the way HF tokenizers' Word::merge_all does.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace frugal {

// GPT-2's reversible map from the 256 byte values to printable characters: printable Latin-1
// bytes map to themselves, the others (controls, space, ...) to U+0100 onwards, so that " the"
// becomes "Ġthe" and no vocabulary entry holds whitespace or control bytes.
class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();
  // The byte-level spelling of raw `bytes` (UTF-8 of the mapped characters).
  std::string encode(std::string_view bytes) const;
  // The bytes a token's characters stand for, or nothing when a character is not in the
  // alphabet (an added token such as "<|im start|>" with a space: its own UTF-8 is used).
  std::optional<std::string> decode(std::string_view token) const;
  const std::string& spelling(unsigned char byte) const { return spelling_[byte]; }

 private:
  std::array<std::string, 256> spelling_;
  std::unordered_map<char32_t, unsigned char> byte_of_;
};

struct BpeSettings {
  bool ignore_merges = false;  // a word found whole in the vocabulary is one token (Llama 3)
  int32_t unk_id = -1;         // for characters not in the vocabulary; -1: they are dropped
  bool fuse_unk = false;       // consecutive unknown characters give one unk
};

class BytePairModel {
 public:
  // `merges` in rank order, each a pair of vocabulary entries whose concatenation is also
  // in the vocabulary; `source` names the file in messages. Throws Error naming the merge.
  BytePairModel(std::unordered_map<std::string, int32_t> vocab,
                const std::vector<std::pair<std::string, std::string>>& merges,
                BpeSettings settings, const std::string& source);

  // Appends the ids of one pre-tokenized word, given in its byte-level spelling.
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  BpeSettings settings_;
};

}  // namespace frugal
