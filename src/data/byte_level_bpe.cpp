// Byte-level BPE: the alphabet, and merging a word by rank with a heap (HF tokenizers'
// Word::merge_all, so that ties and stale heap entries resolve as there).
#include "data/byte_level_bpe.h"

#include <queue>

#include "core/error.h"
#include "data/unicode_text.h"

namespace frugal {

ByteLevelAlphabet::ByteLevelAlphabet() {
  // GPT-2's bytes_to_unicode: '!'..'~', '¡'..'¬', '®'..'ÿ' keep their code point; every
  // other byte gets the next code point from 256 on, in byte order.
  auto keeps_itself = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = keeps_itself(b) ? char32_t(b) : next++;
    append_utf8(spelling_[size_t(b)], cp);
    byte_of_[cp] = static_cast<unsigned char>(b);
  }
}

std::string ByteLevelAlphabet::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += spelling_[static_cast<unsigned char>(c)];
  return out;
}

std::optional<std::string> ByteLevelAlphabet::decode(std::string_view token) const {
  // Every alphabet character is U+0021..U+0143: one or two UTF-8 bytes.
  std::string bytes;
  bytes.reserve(token.size());
  const auto* s = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    char32_t cp;
    if (s[i] < 0x80) {
      cp = s[i];
      i += 1;
    } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = (char32_t(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F);
      i += 2;
    } else {
      return std::nullopt;
    }
    auto it = byte_of_.find(cp);
    if (it == byte_of_.end()) return std::nullopt;
    bytes.push_back(static_cast<char>(it->second));
  }
  return bytes;
}

BytePairModel::BytePairModel(std::unordered_map<std::string, int32_t> vocab,
                             const std::vector<std::pair<std::string, std::string>>& merges,
                             BpeSettings settings, const std::string& source)
    : vocab_(std::move(vocab)), settings_(settings) {
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    // Named references, not a structured binding: clang before 16 (the fuzz build) cannot
    // capture a binding in a lambda.
    const std::string& left = merges[rank].first;
    const std::string& right = merges[rank].second;
    auto id_of = [&](const std::string& token) {
      auto it = vocab_.find(token);
      if (it == vocab_.end())
        fail(source, ": merge ", rank, " ('", left, "', '", right, "') uses '", token,
             "', which is not in the vocabulary");
      return it->second;
    };
    const int32_t a = id_of(left), b = id_of(right), merged = id_of(left + right);
    // A pair listed twice keeps its last rank, as HF's map does.
    merges_[pair_key(a, b)] = Merge{static_cast<int32_t>(rank), merged};
  }
}

void BytePairModel::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (settings_.ignore_merges) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  // The word's characters as symbols in a doubly linked list; a merged-away symbol has
  // length 0 (HF's Symbol).
  struct Symbol {
    int32_t id;
    int64_t prev, next;
    size_t length;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id, size_t length) {
    const int64_t index = static_cast<int64_t>(symbols.size());
    if (!symbols.empty()) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, length});
  };
  // An unknown character waiting to be added (several, with fuse_unk): its byte length.
  size_t pending_unk_length = 0;
  auto flush_unk = [&] {
    if (pending_unk_length > 0) add(settings_.unk_id, pending_unk_length);
    pending_unk_length = 0;
  };
  std::string character;
  for (size_t i = 0; i < word.size();) {
    size_t length = 1;
    const auto lead = static_cast<unsigned char>(word[i]);
    if (lead >= 0xF0)
      length = 4;
    else if (lead >= 0xE0)
      length = 3;
    else if (lead >= 0xC0)
      length = 2;
    length = std::min(length, word.size() - i);
    character.assign(word.substr(i, length));
    auto it = vocab_.find(character);
    if (it != vocab_.end()) {
      flush_unk();
      add(it->second, length);
    } else if (settings_.unk_id >= 0) {
      if (!settings_.fuse_unk) flush_unk();
      pending_unk_length += length;
    }  // else: no unk token, the character is dropped (as HF does)
    i += length;
  }
  flush_unk();

  // Lowest rank first, then leftmost position.
  struct Candidate {
    int32_t rank;
    int64_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto merge_of = [&](int32_t left, int32_t right) -> const Merge* {
    auto it = merges_.find(pair_key(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i)
    if (const Merge* m = merge_of(symbols[i].id, symbols[i + 1].id))
      queue.push({m->rank, static_cast<int64_t>(i), m->new_id});

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& current = symbols[size_t(top.pos)];
    if (current.length == 0 || current.next == -1) continue;
    const int64_t next_pos = current.next;
    const Symbol right = symbols[size_t(next_pos)];
    // A stale entry: the pair at this position has changed since it was queued.
    const Merge* still = merge_of(current.id, right.id);
    if (!still || still->new_id != top.new_id) continue;

    current.id = top.new_id;
    current.length += right.length;
    current.next = right.next;
    symbols[size_t(next_pos)].length = 0;
    if (right.next > -1 && size_t(right.next) < symbols.size())
      symbols[size_t(right.next)].prev = top.pos;

    if (current.prev >= 0)
      if (const Merge* m = merge_of(symbols[size_t(current.prev)].id, current.id))
        queue.push({m->rank, current.prev, m->new_id});
    if (current.next >= 0 && size_t(current.next) < symbols.size())
      if (const Merge* m = merge_of(current.id, symbols[size_t(current.next)].id))
        queue.push({m->rank, top.pos, m->new_id});
  }
  for (const Symbol& s : symbols)
    if (s.length > 0) ids.push_back(s.id);
}

}  // namespace frugal
