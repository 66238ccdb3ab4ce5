// Tokenizer: a SentencePiece model (BPE or unigram with byte fallback, Llama's conventions:
// unk 0, bos 1, eos 2, no pad), loading, encoding and decoding, and training a new one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace frugal {

class Tokenizer {
 public:
  // Loads a SentencePiece `tokenizer.model`; throws Error naming the file when it is missing
  // or is not a SentencePiece model.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of `text`, without bos or eos (the token file writer adds those). Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  // The text of `ids`; control ids (bos, eos) are dropped. Throws Error on an id outside
  // [0, vocab_size).
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;  // the vocabulary entry, e.g. "▁the", "<0x0A>"

  int32_t vocab_size() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;  // -1 when the model has no pad piece (Llama's convention)
  int32_t unk_id() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

struct TokenizerTrainOptions {
  int32_t vocab_size = 2048;
  std::string model_type = "bpe";      // "bpe" or "unigram"
  double character_coverage = 0.9995;  // rarer characters go to byte fallback
  // At most this many training sentences (chunks of at most max_sentence_bytes, cut at line
  // ends), drawn by SentencePiece's seeded reservoir sampling when there are more.
  int64_t input_sentence_size = 200000;
  int32_t max_sentence_bytes = 4096;
  uint32_t seed = 1234;
};

// The fewest ids a byte-fallback model can have: 256 bytes + unk, bos, eos, plus room for
// the characters and merges that make it better than a byte tokenizer.
constexpr int32_t kMinTokenizerVocab = 320;

// Trains a SentencePiece model on `documents` and writes it to `model_path` (e.g.
// "out/tokenizer.model"). Settings follow Llama's tokenizer: byte fallback, identity
// normalization (text round-trips exactly), whitespace kept, digits split, unk=0 bos=1
// eos=2 pad=-1. Newlines stay inside the training sentences, so "\n" gets pieces of its own
// instead of costing a byte-fallback id each. Deterministic: one thread (SentencePiece's
// merges depend on the thread count) and a fixed seed, so the same documents give a
// byte-identical model file. Throws Error for a too small vocab, no text, or a
// SentencePiece failure (e.g. a vocab too large for a tiny corpus), naming the vocab size.
void train_tokenizer(const std::vector<std::string>& documents, const std::string& model_path,
                     const TokenizerTrainOptions& options = {});
// The same from one text file, read as a single document.
void train_tokenizer_from_file(const std::string& text_path, const std::string& model_path,
                               const TokenizerTrainOptions& options = {});

}  // namespace frugal
