// A SentencePiece tokenizer.model (Llama 1 and 2, and the tokenizers `frugal prepare` trains)
// behind the TokenizerModel interface.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer_model.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace frugal {

class SentencePieceModel : public TokenizerModel {
 public:
  // Throws Error naming the file when it is missing or is not a SentencePiece model.
  explicit SentencePieceModel(const std::string& path);
  ~SentencePieceModel() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string piece(int32_t id) const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  int32_t pad_id() const override;
  int32_t unk_id() const override;
  bool prepends_bos() const override { return true; }  // LlamaTokenizer's add_bos_token

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace frugal
