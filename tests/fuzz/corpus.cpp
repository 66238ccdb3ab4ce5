// Fuzz target: a corpus file as `frugal prepare` reads it. The first byte picks how: by its
// name (.txt or .jsonl, auto-detection), as text, fortune or JSON records (detected, or of one
// named format: messages, sharegpt, alpaca, completion), with or without skipping bad records;
// the rest is the file. Every document kept must be valid UTF-8, a text must not be blank, a
// completion and an assistant turn must not be empty, a conversation must have a message.
#include "data/corpus.h"

#include "core/error.h"
#include "fuzz_support.h"

namespace {

bool blank(const std::string& s) { return s.find_first_not_of(" \t\n\r\f\v") == std::string::npos; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace frugal;
  if (size == 0) return 0;
  static const struct {
    const char* name;
    CorpusFormat format;
  } kWays[] = {{"corpus.txt", CorpusFormat::auto_detect},
               {"corpus.jsonl", CorpusFormat::auto_detect},
               {"corpus", CorpusFormat::text},
               {"corpus", CorpusFormat::fortune},
               {"corpus", CorpusFormat::jsonl},
               {"corpus", CorpusFormat::messages},
               {"corpus", CorpusFormat::sharegpt},
               {"corpus", CorpusFormat::alpaca},
               {"corpus", CorpusFormat::completion}};
  constexpr size_t kCount = sizeof(kWays) / sizeof(kWays[0]);
  const auto& way = kWays[data[0] % kCount];
  CorpusOptions options;
  options.format = way.format;
  options.skip_bad_records = (data[0] / kCount) % 2 == 1;
  const std::string path = fuzz::write_scratch(way.name, data + 1, size - 1);
  try {
    Corpus corpus;
    read_corpus_file(path, options, corpus);
    for (const CorpusDocument& doc : corpus.documents) {
      if (!is_valid_utf8(doc.text) || !is_valid_utf8(doc.completion)) abort();
      switch (doc.content) {
        case DocumentContent::text:
          if (blank(doc.text)) abort();
          break;
        case DocumentContent::instruction:
          if (blank(doc.completion)) abort();
          break;
        case DocumentContent::chat:
          if (doc.conversation.empty()) abort();
          for (const ChatMessage& m : doc.conversation)
            if (!is_valid_utf8(m.content) || (m.role == ChatRole::assistant && blank(m.content)))
              abort();
          break;
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
