// What tokenizer training hands to SentencePiece (data/sentencepiece_model.h): documents cut into
// sentences at line ends or character boundaries, and past max_training_bytes a seeded sample of
// whole sentences in corpus order, so that one 100 MB document costs seconds and a bounded
// amount of memory (it used to cost an hour of cutting and then SentencePiece on all of it).
#include <string>
#include <vector>

#include "catch_compat.h"
#include "data/sentencepiece_model.h"
#include "data/tokenizer.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;

namespace {

// Words of 1- to 3-byte UTF-8 characters separated by spaces, `bytes` long, without a line end
// unless `line_every` > 0 (then one after about every line_every bytes).
std::string document(size_t bytes, size_t line_every) {
  const char* words[] = {"alpha", "beta", "gamma", "Ωmega", "中文", "naïve", "x", "déjà"};
  std::string doc;
  uint64_t state = 7;
  size_t since_line = 0;
  while (doc.size() < bytes) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const std::string word = words[(state >> 33) % 8];
    doc += word;
    since_line += word.size() + 1;
    if (line_every > 0 && since_line >= line_every) {
      doc += '\n';
      since_line = 0;
    } else {
      doc += ' ';
    }
  }
  return doc;
}

bool starts_a_character(const std::string& text, size_t i) {
  return i >= text.size() || (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
}

}  // namespace

TEST_CASE("tokenizer training text: every sentence of a corpus within the bound", "[tokenizer]") {
  TokenizerTrainOptions options;
  options.max_sentence_bytes = 256;
  for (size_t line_every : {size_t(0), size_t(100), size_t(400)}) {
    INFO("a line end about every " << line_every << " bytes");
    const std::vector<std::string> docs = {document(20000, line_every), "short", ""};
    const TokenizerTrainingText text = tokenizer_training_text(docs, options);
    std::string joined;
    size_t offset = 0;
    for (const std::string& s : text.sentences) {
      CHECK(!s.empty());
      CHECK(s.size() <= 256);
      if (offset < docs[0].size()) {
        REQUIRE(docs[0].compare(offset, s.size(), s) == 0);
        const size_t end = offset + s.size();
        CHECK(starts_a_character(docs[0], end));
        // Cut after the last line end within reach, when there is one.
        const size_t reach = std::min(docs[0].size(), offset + 256);
        const size_t newline = docs[0].rfind('\n', reach - 1);
        if (end < docs[0].size() && newline != std::string::npos && newline >= offset)
          CHECK(end == newline + 1);
        offset = end;
      }
      joined += s;
    }
    CHECK(joined == docs[0] + docs[1]);  // every byte once, in order; "" gives no sentence
    CHECK(text.bytes == int64_t(joined.size()));
    CHECK(text.corpus_bytes == text.bytes);
    CHECK(text.corpus_sentences == int64_t(text.sentences.size()));
  }
}

TEST_CASE("tokenizer training text: a large corpus gives a seeded sample within the bound",
          "[tokenizer]") {
  const std::vector<std::string> docs = {document(3 << 20, 0), document(1 << 20, 300)};
  TokenizerTrainOptions options;
  options.max_training_bytes = 256 << 10;
  const TokenizerTrainingText text = tokenizer_training_text(docs, options);
  CHECK(text.corpus_bytes == int64_t(docs[0].size() + docs[1].size()));
  CHECK(text.bytes <= options.max_training_bytes);
  CHECK(text.bytes > options.max_training_bytes - options.max_sentence_bytes);
  int64_t sum = 0;
  for (const std::string& s : text.sentences) sum += int64_t(s.size());
  CHECK(sum == text.bytes);
  // Whole sentences of the corpus, in its order: each found after the one before.
  size_t doc = 0, offset = 0;
  for (const std::string& s : text.sentences) {
    size_t at = docs[doc].find(s, offset);
    if (at == std::string::npos && doc == 0) {
      doc = 1;
      at = docs[1].find(s);
    }
    REQUIRE(at != std::string::npos);
    offset = at + s.size();
  }
  CHECK(doc == 1);  // drawn from both documents
  // The same seed draws the same sample; another seed another one.
  CHECK(tokenizer_training_text(docs, options).sentences == text.sentences);
  options.seed = 99;
  CHECK(tokenizer_training_text(docs, options).sentences != text.sentences);
  // 0: no bound.
  options.max_training_bytes = 0;
  CHECK(tokenizer_training_text(docs, options).bytes == text.corpus_bytes);
  options.max_training_bytes = 100;
  CHECK(contains(error_of([&] { tokenizer_training_text(docs, options); }),
                 "max training bytes 100 is below the max sentence bytes 4096"));
}

TEST_CASE("tokenizer training: a document past the bound trains on the sample", "[tokenizer]") {
  TempDir dir;
  // 1 MiB on one line, a quarter of it trained on.
  const std::vector<std::string> docs = {document(1 << 20, 0)};
  TokenizerTrainOptions options;
  options.vocab_size = kMinTokenizerVocab;  // eight words have few pieces to learn
  options.max_training_bytes = 256 << 10;
  train_tokenizer(docs, dir.file("sampled.model"), options);
  Tokenizer tok(dir.file("sampled.model"));
  CHECK(tok.vocab_size() == kMinTokenizerVocab);
  const std::string part = docs[0].substr(0, 5000);
  const std::vector<int32_t> ids = tok.encode(part);
  CHECK(ids.size() < part.size() / 2);  // the sample's words were learnt
  CHECK(tok.decode(ids) == part);
}
