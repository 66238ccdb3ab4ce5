// A SentencePiece tokenizer.model (Llama 1 and 2, and the tokenizers `frugal prepare` trains)
// behind the TokenizerModel interface.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/added_tokens.h"
#include "data/tokenizer_model.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace frugal {

struct TokenizerTrainOptions;

// What train_tokenizer hands to SentencePiece: the documents cut into sentences of at most
// max_sentence_bytes (at line ends where they can be), and when those hold more than
// max_training_bytes, a sample of whole sentences in corpus order drawn by a shuffle seeded
// with the options' seed. Throws Error for a max_sentence_bytes below 16 or a
// max_training_bytes below it.
struct TokenizerTrainingText {
  std::vector<std::string> sentences;
  int64_t bytes = 0;         // of the sentences
  int64_t corpus_bytes = 0;  // of every sentence of the corpus
  int64_t corpus_sentences = 0;
};
TokenizerTrainingText tokenizer_training_text(const std::vector<std::string>& documents,
                                              const TokenizerTrainOptions& options);

// Seconds between the lines that say SentencePiece's training is still at work.
inline constexpr double kTrainingHeartbeatSeconds = 10;

class SentencePieceModel : public TokenizerModel {
 public:
  // Throws Error naming the file when it is missing or is not a SentencePiece model.
  explicit SentencePieceModel(const std::string& path);
  ~SentencePieceModel() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  // Without the prefix space (sentencepiece_special.cpp).
  std::vector<int32_t> encode_continuing(std::string_view text) const override;
  // Control pieces (<s>, </s>, Mistral's [INST]) and <unk> are matched in the text; each
  // stretch between them gets the prefix space (SentencePiece's dummy prefix) as transformers'
  // LlamaTokenizer gives it: at the text's start only ("first", transformers' default), before
  // every stretch (tokenizer_config.json's "legacy": true), or never ("add_prefix_space":
  // false). (sentencepiece_special.cpp)
  void encode_template_output(std::string_view text, TokenSpans& out) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string piece(int32_t id) const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  int32_t pad_id() const override;
  int32_t unk_id() const override;
  bool prepends_bos() const override { return true; }  // LlamaTokenizer's add_bos_token

 private:
  // Where the prefix space goes in template output (transformers' Metaspace prepend_scheme).
  enum class PrefixSpace { first, always, never };
  void read_special_tokens();  // the matcher and the prefix rule (sentencepiece_special.cpp)
  const sentencepiece::SentencePieceProcessor& without_prefix_space() const;

  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  AddedTokenMatcher special_tokens_;
  PrefixSpace prefix_space_ = PrefixSpace::first;
  // The same model with add_dummy_prefix off, made when first needed.
  mutable std::once_flag without_prefix_once_;
  mutable std::unique_ptr<sentencepiece::SentencePieceProcessor> without_prefix_;
};

}  // namespace frugal
