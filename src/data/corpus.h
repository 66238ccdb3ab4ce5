// Corpus: documents read from text files, fortune files (entries between lines holding only
// "%"), JSONL (a "text" field, or alpaca-style instruction/input/output), or directories.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace frugal {

enum class CorpusFormat {
  auto_detect,  // per file: .jsonl/.json -> jsonl; a line holding only "%" -> fortune; else text
  text,         // the whole file is one document
  fortune,      // documents separated by lines holding only "%"
  jsonl,        // one JSON object per line (or, for a file starting with '[', a JSON array)
};
CorpusFormat corpus_format_from_name(const std::string& name);  // "auto", "text", ...
std::string corpus_format_name(CorpusFormat format);

struct CorpusStats {
  int64_t files = 0;                 // files read
  int64_t documents = 0;             // documents kept
  int64_t bytes = 0;                 // bytes of text kept
  int64_t skipped_empty = 0;         // documents with nothing but whitespace
  int64_t skipped_invalid_utf8 = 0;  // documents that are not valid UTF-8
  int64_t skipped_files = 0;         // files a directory walk passed over (binary, .dat)
};

struct Corpus {
  std::vector<std::string> documents;
  std::vector<std::string> files;  // the files read, in reading order
  CorpusStats stats;
};

// Reads every path in order. A directory is walked recursively in sorted path order (so the
// corpus does not depend on the file system's listing order); hidden entries, *.dat (fortune
// index files), files whose first 8 KiB hold a NUL byte, and second names of a file already
// read (fortune's *.u8 symlinks) are skipped. A path given explicitly that is missing, or
// binary, is an Error naming it. A bad JSONL line is an Error naming the file and line.
//
// Non-UTF-8 text: a document that is not valid UTF-8 is skipped and counted (the caller
// warns with the count). SentencePiece replaces invalid bytes by U+FFFD before byte fallback
// could see them, so passing them through would not preserve them anyway, and a guessed
// re-encoding (Latin-1?) would be silently wrong for some files.
Corpus read_corpus(const std::vector<std::string>& paths,
                   CorpusFormat format = CorpusFormat::auto_detect);

// Reads one file (not a directory) and appends its documents to `corpus`.
void read_corpus_file(const std::string& path, CorpusFormat format, Corpus& corpus);

// The pieces below, for tests and for other readers.

// Documents of a fortune file: the text between lines that hold only "%" (a trailing "\r" is
// allowed). Leading blank lines and trailing whitespace of each entry are trimmed; the
// leading spaces of the first line stay (ASCII art). Empty entries are dropped.
std::vector<std::string> split_fortunes(std::string_view text);

// True when `text` holds a line consisting only of "%".
bool has_fortune_separator(std::string_view text);

// Stanford Alpaca's prompt template; the document of a record is the prompt followed by the
// output. `input` may be empty (the template without the "### Input:" section).
std::string alpaca_prompt(const std::string& instruction, const std::string& input);

// Parses JSONL text (`name` only labels errors): every non-blank line is a JSON object with a
// string "text", or string "instruction" and "output" (and optional "input"). Throws Error
// "<name>:<line>: ..." for invalid JSON or an object with neither.
std::vector<std::string> parse_jsonl(std::string_view text, const std::string& name);

bool is_valid_utf8(std::string_view text);

}  // namespace frugal
