// Tokenizer: the tokenizer a model comes with, whichever format it is in (TokenizerKind):
// a SentencePiece tokenizer.model (Llama 1 and 2, and what `frugal prepare` trains: unk 0,
// bos 1, eos 2, no pad) or a Hugging Face tokenizer.json of the byte-level BPE kind (Llama 3,
// Qwen2). Finding the tokenizer in a directory, copying it with its companion files, and
// training a new SentencePiece model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/enum_names.h"
#include "data/tokenizer_model.h"

namespace frugal {

enum class TokenizerKind {
  sentencepiece,   // tokenizer.model (protobuf)
  byte_level_bpe,  // tokenizer.json, with tokenizer_config.json beside it for bos and eos
};
inline std::span<const EnumName<TokenizerKind>> enum_names(TokenizerKind) {
  static constexpr EnumName<TokenizerKind> names[] = {
      {TokenizerKind::sentencepiece, "sentencepiece"},
      {TokenizerKind::byte_level_bpe, "byte-level BPE"}};
  return names;
}

// The kind of the file at `path`, from its content (a JSON object is a tokenizer.json,
// anything else is taken for SentencePiece). Throws Error when it cannot be read.
TokenizerKind tokenizer_kind_of(const std::string& path);
// The file name a kind has in a model or data directory: tokenizer.model, tokenizer.json.
const char* tokenizer_file_name(TokenizerKind kind);
// DIR's tokenizer: tokenizer.model when there is one (Llama 1 and 2 directories hold both
// files, and the SentencePiece model is their original), else tokenizer.json, else "".
std::string find_tokenizer(const std::string& dir);
// The files beside a tokenizer that belong to it: tokenizer_config.json (special tokens, the
// chat template, SentencePiece's legacy prefix rule), chat_template.jinja,
// generation_config.json (the ids that end a reply).
const std::vector<std::string>& tokenizer_companion_files();
// Copies the tokenizer at `path` into `dir` under its kind's file name, with the companion files
// it has beside it (those `dir` holds from another tokenizer are removed), so that it is what
// find_tokenizer(dir) finds: a tokenizer.json copied removes a tokenizer.model already there
// (with a warning). Returns the new path. Copying a file onto itself does nothing.
std::string copy_tokenizer(const std::string& path, const std::string& dir);

class Tokenizer {
 public:
  // Loads the tokenizer at `path`, of the kind its content says; throws Error naming the file
  // when it is missing, is neither kind, or uses what frugal does not implement.
  explicit Tokenizer(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of `text`, without bos or eos (the token file writer adds those). Text that is not
  // valid UTF-8 is encoded as its U+FFFD-repaired form by tokenizer.json (as transformers
  // sees it), byte by byte by SentencePiece's byte fallback. Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  // `text` (valid UTF-8) as transformers tokenizes what a chat template renders
  // (apply_chat_template(tokenize=True)): the strings of special tokens (bos, eos, <|im_end|>,
  // [INST] ...) are those tokens, the text between them is encoded on its own, nothing is
  // added; each id with the bytes of `text` it stands for. Thread-safe.
  TokenSpans encode_template_output(std::string_view text) const;
  // The ids encode(text) gives, computed piece by piece for a long text, so that memory follows
  // a piece (SentencePiece takes about 200 bytes a byte of its input: 20 GB for one 100 MB
  // document) and `progress` hears of each piece's bytes: pieces of about `piece_bytes`, cut
  // after a line end that a character other than whitespace follows, or before a lone space
  // between other characters (no token of a byte-level pre-tokenizer's words or of a
  // SentencePiece model trained on lines spans such a cut), each after the first encoded as a
  // continuation (no prefix space). A text without such a cut is one piece. Thread-safe.
  std::vector<int32_t> encode_long(std::string_view text,
                                   const std::function<void(int64_t)>& progress = nullptr,
                                   size_t piece_bytes = size_t(1) << 20) const;
  // The text of `ids`; control and special ids (bos, eos, <|im_end|>, ...) are dropped.
  // Throws Error on an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;
  // The vocabulary entry, e.g. "▁the", "<0x0A>" (SentencePiece), "Ġthe" (byte-level BPE).
  std::string piece(int32_t id) const;

  // Whether a text is encoded as bos + ids by the model's convention: always for SentencePiece
  // (Llama's), and for a tokenizer.json when its post-processor adds one (Llama 3 does, Qwen2
  // does not).
  bool prepends_bos() const;
  TokenizerKind kind() const { return kind_; }
  int32_t vocab_size() const;  // one past the largest id
  int32_t bos_id() const;      // -1 when the tokenizer has none
  int32_t eos_id() const;
  int32_t pad_id() const;  // -1 when the model has no pad piece (Llama's convention)
  int32_t unk_id() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  TokenizerKind kind_;
  std::unique_ptr<TokenizerModel> model_;
};

struct TokenizerTrainOptions {
  int32_t vocab_size = 2048;
  std::string model_type = "bpe";      // "bpe" or "unigram"
  double character_coverage = 0.9995;  // rarer characters go to byte fallback
  // At most this many training sentences (chunks of at most max_sentence_bytes, cut at line
  // ends), drawn by SentencePiece's seeded reservoir sampling when there are more.
  int64_t input_sentence_size = 200000;
  int32_t max_sentence_bytes = 4096;
  // At most this many bytes of sentences go to SentencePiece, whose time and memory grow with
  // the text it gets (a sentence count alone does not bound them: 200000 sentences of 4096
  // bytes are 800 MB). A larger corpus gives a sample of its sentences, drawn by a shuffle
  // seeded with `seed`, in corpus order. 0: no bound.
  int64_t max_training_bytes = int64_t(32) << 20;
  uint32_t seed = 1234;
};

// Training a SentencePiece model (implemented in sentencepiece_model.cpp).

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
