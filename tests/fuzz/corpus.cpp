// Fuzz target: a corpus file as `frugal prepare` reads it. The first byte picks how: by its
// name (.txt or .jsonl, auto-detection) or as text, fortune or JSONL explicitly; the rest is
// the file. Every document kept must be valid UTF-8 and not empty.
#include "data/corpus.h"

#include "core/error.h"
#include "fuzz_support.h"

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
               {"corpus", CorpusFormat::jsonl}};
  const auto& way = kWays[data[0] % 5];
  const std::string path = fuzz::write_scratch(way.name, data + 1, size - 1);
  try {
    Corpus corpus;
    read_corpus_file(path, way.format, corpus);
    for (const std::string& document : corpus.documents)
      if (!is_valid_utf8(document) || document.find_first_not_of(" \t\r\n") == std::string::npos)
        abort();
  } catch (const Error&) {
  }
  return 0;
}
