// A sequence's text printed while it grows (`frugal generate`): after each token, the text of
// the whole sequence decoded so far, less what is out already. A token's text can depend on the
// tokens after it (a byte-fallback character takes several, and decodes as U+FFFD while
// incomplete), so text ending in U+FFFD is held back until the next token or the end. Each
// token decodes the whole sequence again, quadratic in its length (its cost beside a forward
// pass not measured); a generation of hundreds of thousands of tokens would want a decoding of
// the tail alone.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace frugal {

class TextStream {
 public:
  using Decode = std::function<std::string(const std::vector<int32_t>&)>;
  TextStream(Decode decode, std::vector<int32_t> prompt);

  // The text to print now: the prompt's (start), then what `token` adds (push).
  std::string start();
  std::string push(int32_t token);
  // The rest, at the end. If the whole sequence's text does not extend what was printed (a
  // tokenizer whose text for a prefix is not a prefix of the whole's), the whole text follows
  // on a line of its own, so that the last line is always the exact decoding.
  std::string finish();
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  std::string advance(bool last);
  Decode decode_;
  std::vector<int32_t> tokens_;
  std::string printed_;
};

}  // namespace frugal
