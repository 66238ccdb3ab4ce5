// What a tokenizer format provides behind frugal's Tokenizer (data/tokenizer.h): SentencePiece
// (sentencepiece_model.cpp) and Hugging Face tokenizer.json byte-level BPE (hf_tokenizer.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace frugal {

// Token ids with the bytes of the text each stands for: token i is text[begin[i], end[i]). A
// token that stands for no byte (SentencePiece's prefix space) has an empty range at its place.
struct TokenSpans {
  std::vector<int32_t> ids;
  std::vector<size_t> begin, end;
  void push(int32_t id, size_t b, size_t e) {
    ids.push_back(id);
    begin.push_back(b);
    end.push_back(e);
  }
};

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  // The ids of `text`, nothing added. Thread-safe.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The ids of `text` as the continuation of a text that ended just before it (SentencePiece:
  // no prefix space). The default: encode.
  virtual std::vector<int32_t> encode_continuing(std::string_view text) const {
    return encode(text);
  }
  // `text` (valid UTF-8) as transformers tokenizes the output of a chat template: the strings
  // of the special and added tokens are those tokens, and the text between them is encoded on
  // its own; appended to `out` with the bytes each token stands for. Thread-safe.
  virtual void encode_template_output(std::string_view text, TokenSpans& out) const = 0;
  // The text of `ids` (each already checked to be in [0, vocab_size())), special and
  // control tokens dropped.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual std::string piece(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when there is none
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  virtual int32_t unk_id() const = 0;
  virtual bool prepends_bos() const = 0;
};

}  // namespace frugal
