// Fuzz target: a Hugging Face tokenizer.json. Loading parses it (model, merges, added tokens,
// normalizer, pre-tokenizer regexes compiled by PCRE2, decoder, post-processor); when it loads,
// a fixed text (added-token strings, whitespace runs, NFC material, invalid UTF-8) is encoded
// and its ids decoded.
#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace frugal;
  static const std::string text =
      "Hello <|begin_of_text|>it's 12345 caf\xC3\xA9 e\xCC\x81   \t\n\n  x \xF0\x9F\x98\x80"
      "<|endoftext|> \xE4\xBD\xA0\xE5\xA5\xBD \xFF\xC0\xAF\xED\xA0\x80 <|im_start|";
  const std::string path = fuzz::write_scratch("tok/tokenizer.json", data, size);
  try {
    const Tokenizer tokenizer(path);
    const std::vector<int32_t> ids = tokenizer.encode(text);
    tokenizer.decode(ids);
    for (int32_t id = 0; id < tokenizer.vocab_size() && id < 64; ++id) tokenizer.piece(id);
  } catch (const Error&) {
  }
  return 0;
}
