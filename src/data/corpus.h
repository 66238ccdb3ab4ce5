// Corpus: documents read from text files, fortune files (entries between lines holding only
// "%"), JSON records (one per line, or an array: text, instruction and chat data, see
// data/records.h), or directories of them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/enum_names.h"
#include "data/records.h"

namespace frugal {

enum class CorpusFormat {
  auto_detect,  // per file: .jsonl/.json -> jsonl; a line holding only "%" -> fortune; else text
  text,         // the whole file is one document
  fortune,      // documents separated by lines holding only "%"
  jsonl,        // JSON records, their format told by the file's first record's keys
  messages,     // JSON records of each format, named (data/records.h)
  sharegpt,
  alpaca,
  completion,
};
inline std::span<const EnumName<CorpusFormat>> enum_names(CorpusFormat) {
  static constexpr EnumName<CorpusFormat> names[] = {
      {CorpusFormat::auto_detect, "auto"},  {CorpusFormat::text, "text"},
      {CorpusFormat::fortune, "fortune"},   {CorpusFormat::jsonl, "jsonl"},
      {CorpusFormat::messages, "messages"}, {CorpusFormat::sharegpt, "sharegpt"},
      {CorpusFormat::alpaca, "alpaca"},     {CorpusFormat::completion, "completion"}};
  return names;
}

struct CorpusStats {
  int64_t files = 0;                 // files read
  int64_t documents = 0;             // documents kept
  int64_t bytes = 0;                 // bytes of text kept
  int64_t skipped_empty = 0;         // text documents with nothing but whitespace
  int64_t skipped_invalid_utf8 = 0;  // documents (or JSONL lines) that are not valid UTF-8
  int64_t skipped_files = 0;         // files a directory walk passed over (binary, .dat)
  int64_t skipped_bad_records = 0;   // records refused, with skip_bad_records
};

struct CorpusOptions {
  CorpusFormat format = CorpusFormat::auto_detect;
  // A record that is not valid JSON or not a valid record of its format is skipped and counted
  // (its message kept in Corpus::bad_records) instead of stopping the read with an Error.
  bool skip_bad_records = false;
};

struct Corpus {
  std::vector<CorpusDocument> documents;
  std::vector<std::string> files;  // the files read, in reading order
  CorpusStats stats;
  std::vector<std::string> bad_records;  // the first kMaxBadRecordMessages refusals
  // The kinds of document read (DocumentContent bits).
  uint32_t content() const;
};
constexpr size_t kMaxBadRecordMessages = 5;

// Reads every path in order. A directory is walked recursively in sorted path order (so the
// corpus does not depend on the file system's listing order); hidden entries, *.dat (fortune
// index files), files whose first 8 KiB hold a NUL byte, and second names of a file already
// read (fortune's *.u8 symlinks) are skipped. A path given explicitly that is missing, or
// binary, is an Error naming it. A bad record is an Error naming the file and line (unless
// skip_bad_records).
//
// Non-UTF-8 text: a document (a JSONL line) that is not valid UTF-8 is skipped and counted (the
// caller warns with the count). Tokenizers replace invalid bytes by U+FFFD, so passing them
// through would not preserve them anyway, and a guessed re-encoding (Latin-1?) would be
// silently wrong for some files.
Corpus read_corpus(const std::vector<std::string>& paths, const CorpusOptions& options = {});

// Reads one file (not a directory) and appends its documents to `corpus`.
void read_corpus_file(const std::string& path, const CorpusOptions& options, Corpus& corpus);

// The pieces below, for tests and for other readers.

// Documents of a fortune file: the text between lines that hold only "%" (a trailing "\r" is
// allowed). Leading blank lines and trailing whitespace of each entry are trimmed; the
// leading spaces of the first line stay (ASCII art). Empty entries are dropped.
std::vector<std::string> split_fortunes(std::string_view text);

// True when `text` holds a line consisting only of "%".
bool has_fortune_separator(std::string_view text);

// Parses JSONL text (`name` labels documents and errors): every non-blank line is a JSON object,
// a record of `format` (jsonl: of the format the first record's keys say, the same for every
// line). Throws Error "<name>:<line>: ..." for invalid JSON or a bad record.
std::vector<CorpusDocument> parse_jsonl(std::string_view text, const std::string& name,
                                        CorpusFormat format = CorpusFormat::jsonl);

bool is_valid_utf8(std::string_view text);

}  // namespace frugal
