// A Hugging Face tokenizer.json of the byte-level BPE kind (Llama 3, Qwen2 and their
// relatives), encoding and decoding as HF tokenizers does:
//   added tokens (leftmost-longest, before anything else) -> normalizer (none or NFC) ->
//   Split pre-tokenizers (PCRE2 regexes, Isolated) -> ByteLevel bytes-to-characters ->
//   BPE merges by rank (ignore_merges honoured) -> ids.
// Text that is not valid UTF-8 is first repaired with U+FFFD per maximal invalid subpart, as
// Python's bytes.decode(errors="replace") does before transformers sees a str.
// bos and eos come from tokenizer_config.json next to the file (bos_token, eos_token), bos
// otherwise from a TemplateProcessing post-processor; the post-processor adds nothing here
// (callers add bos themselves) and chat templates are not read.
// Anything else a tokenizer.json may say (another model type, pre-tokenizer, normalizer or
// decoder, BPE dropout, word prefixes or suffixes, byte fallback, lstrip/rstrip/single-word
// added tokens) is refused with an Error that names it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "data/added_tokens.h"
#include "data/byte_level_bpe.h"
#include "data/tokenizer_model.h"
#include "data/unicode_regex.h"

namespace frugal {

class HfTokenizer : public TokenizerModel {
 public:
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  void encode_template_output(std::string_view text, TokenSpans& out) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string piece(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  int32_t unk_id() const override { return unk_id_; }
  bool prepends_bos() const override { return template_bos_id_ >= 0; }

 private:
  void encode_text(std::string_view text, std::vector<int32_t>& ids,
                   std::vector<size_t>* ends) const;
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;
  int32_t id_of(const std::string& token) const;  // -1 when unknown

  std::string path_;
  bool nfc_ = false;
  AddedTokenMatcher raw_tokens_;         // matched in the text as given (normalized: false)
  AddedTokenMatcher normalized_tokens_;  // matched after normalization (normalized: true)
  std::vector<UnicodeRegex> splits_;     // Split pre-tokenizers, in order
  ByteLevelAlphabet alphabet_;
  std::unique_ptr<BytePairModel> model_;
  std::vector<std::optional<std::string>> id_to_token_;
  std::unordered_map<std::string, int32_t> added_ids_;
  std::unordered_set<std::string> special_tokens_;
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
  int32_t template_bos_id_ = -1;  // what the TemplateProcessing post-processor puts first
};

}  // namespace frugal
