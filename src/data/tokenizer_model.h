// What a tokenizer format provides behind frugal's Tokenizer (data/tokenizer.h): SentencePiece
// (sentencepiece_model.cpp) and Hugging Face tokenizer.json byte-level BPE (hf_tokenizer.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace frugal {

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  // The ids of `text`, nothing added. Thread-safe.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
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
