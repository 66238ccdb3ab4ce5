// Reading documents from text, fortune, JSONL files and directory trees.
#include "data/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/regular_file.h"

namespace frugal {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool is_valid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are invalid.
    static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    i += len;
  }
  return true;
}

namespace {

// Calls fn(line, line_number) for every line of text; the line excludes "\n" and a "\r".
template <class Fn>
void for_each_line(std::string_view text, Fn&& fn) {
  size_t begin = 0;
  int64_t number = 1;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    fn(line, number, begin, end);
    begin = end + 1;
    ++number;
  }
}

bool is_blank(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  });
}

// Drops leading blank lines (not the indentation of the first text line) and trailing
// whitespace.
std::string trim_entry(std::string_view entry) {
  size_t begin = 0;
  for (;;) {
    size_t newline = entry.find('\n', begin);
    if (newline == std::string_view::npos || !is_blank(entry.substr(begin, newline - begin))) break;
    begin = newline + 1;
  }
  size_t end = entry.size();
  while (end > begin &&
         std::string_view(" \t\n\r\f\v").find(entry[end - 1]) != std::string_view::npos)
    --end;
  return std::string(entry.substr(begin, end - begin));
}

std::string read_file_bytes(const std::string& path) {
  require_regular_file(path, "corpus file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open corpus file '", path, "'");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("reading corpus file '", path, "' failed");
  return text.str();
}

// The offset of a NUL byte in the first 8 KiB, or npos: how `grep` and `git` tell binary
// files from text.
size_t binary_marker(std::string_view text) {
  return text.substr(0, std::min<size_t>(text.size(), 8192)).find('\0');
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void add_document(CorpusDocument doc, Corpus& corpus) {
  if (doc.content == DocumentContent::text && is_blank(doc.text)) {
    ++corpus.stats.skipped_empty;
    return;
  }
  // Records were valid JSON, hence UTF-8; text files are checked here.
  if (doc.content == DocumentContent::text && !is_valid_utf8(doc.text)) {
    ++corpus.stats.skipped_invalid_utf8;
    return;
  }
  corpus.stats.bytes += static_cast<int64_t>(doc.plain_bytes());
  ++corpus.stats.documents;
  corpus.documents.push_back(std::move(doc));
}

// The record format of a file, when the corpus format names one.
std::optional<RecordFormat> named_record_format(CorpusFormat format) {
  switch (format) {
    case CorpusFormat::messages:
      return RecordFormat::messages;
    case CorpusFormat::sharegpt:
      return RecordFormat::sharegpt;
    case CorpusFormat::alpaca:
      return RecordFormat::alpaca;
    case CorpusFormat::completion:
      return RecordFormat::completion;
    default:
      return std::nullopt;
  }
}

bool is_record_format(CorpusFormat format) {
  return format == CorpusFormat::jsonl || named_record_format(format).has_value();
}

// Reads records one at a time, each a JSON text: the file's record format is the named one, or
// the first record's (jsonl), and every record must be of it.
class RecordReader {
 public:
  explicit RecordReader(CorpusFormat format) : format_(named_record_format(format)) {}

  CorpusDocument read(std::string_view text, const std::string& where) {
    json record;
    try {
      record = json::parse(text);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number too large
      fail(where, ": invalid JSON (", e.what(), ")");
    }
    if (!record.is_object()) fail(where, ": expected a JSON object, got ", record.type_name());
    const std::optional<RecordFormat> detected = detect_record_format(record);
    if (!format_) {
      if (!detected)
        fail(where, ": the record has none of the fields that tell its format: \"messages\", ",
             "\"conversations\", \"prompt\" and \"completion\", \"instruction\" and \"output\", ",
             "\"text\"");
      format_ = detected;
      told_by_ = where;
    } else if (!told_by_.empty() && detected && *detected != *format_) {
      fail(where, ": a ", enum_name(*detected), " record in a file of ", enum_name(*format_),
           " records (told by ", told_by_, "); give --format to read every record as one format");
    }
    return document_from_record(record, *format_, where);
  }

 private:
  std::optional<RecordFormat> format_;
  std::string told_by_;  // where the format was told, when the first record told it
};

}  // namespace

bool has_fortune_separator(std::string_view text) {
  bool found = false;
  for_each_line(text, [&](std::string_view line, int64_t, size_t, size_t) {
    if (line == "%") found = true;
  });
  return found;
}

std::vector<std::string> split_fortunes(std::string_view text) {
  std::vector<std::string> docs;
  size_t entry_begin = 0;
  auto close_entry = [&](size_t entry_end) {
    std::string entry = trim_entry(text.substr(entry_begin, entry_end - entry_begin));
    if (!entry.empty()) docs.push_back(std::move(entry));
  };
  for_each_line(text, [&](std::string_view line, int64_t, size_t begin, size_t end) {
    if (line == "%") {
      close_entry(begin);
      entry_begin = std::min(end + 1, text.size());
    }
  });
  close_entry(text.size());
  return docs;
}

std::vector<CorpusDocument> parse_jsonl(std::string_view text, const std::string& name,
                                        CorpusFormat format) {
  FRUGAL_CHECK(is_record_format(format), "parse_jsonl: format ", enum_name(format),
               " is not one of records");
  RecordReader reader(format);
  std::vector<CorpusDocument> docs;
  for_each_line(text, [&](std::string_view line, int64_t number, size_t, size_t) {
    if (is_blank(line)) return;
    docs.push_back(reader.read(line, name + ":" + std::to_string(number)));
  });
  return docs;
}

uint32_t Corpus::content() const {
  uint32_t bits = 0;
  for (const CorpusDocument& doc : documents) bits |= content_bit(doc.content);
  return bits;
}

void read_corpus_file(const std::string& path, const CorpusOptions& options, Corpus& corpus) {
  const std::string text = read_file_bytes(path);
  if (size_t nul = binary_marker(text); nul != std::string::npos)
    fail("corpus file '", path, "' looks binary (NUL byte at offset ", nul, ")");
  CorpusFormat format = options.format;
  if (format == CorpusFormat::auto_detect) {
    if (ends_with(path, ".jsonl") || ends_with(path, ".json"))
      format = CorpusFormat::jsonl;
    else if (has_fortune_separator(text))
      format = CorpusFormat::fortune;
    else
      format = CorpusFormat::text;
  }
  ++corpus.stats.files;
  corpus.files.push_back(path);
  auto add_text = [&](std::string doc, const std::string& where) {
    CorpusDocument d;
    d.text = std::move(doc);
    d.where = where;
    add_document(std::move(d), corpus);
  };
  if (format == CorpusFormat::text) {
    add_text(text, path);
    return;
  }
  if (format == CorpusFormat::fortune) {
    int64_t entry = 0;
    for (std::string& doc : split_fortunes(text))
      add_text(std::move(doc), path + ": entry " + std::to_string(entry++));
    return;
  }
  // JSON records: one a line, or (a file starting with '[') an array of them.
  RecordReader reader(format);
  auto read_record = [&](std::string_view record, const std::string& where) {
    if (!is_valid_utf8(record)) {  // nlohmann refuses the whole text; the record alone is skipped
      ++corpus.stats.skipped_invalid_utf8;
      return;
    }
    try {
      add_document(reader.read(record, where), corpus);
    } catch (const Error& e) {
      if (!options.skip_bad_records) throw;
      ++corpus.stats.skipped_bad_records;
      if (corpus.bad_records.size() < kMaxBadRecordMessages) corpus.bad_records.push_back(e.what());
    }
  };
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    // A JSON array of records (Stanford Alpaca's alpaca_data.json): valid JSON as a whole or
    // not at all.
    json records;
    try {
      records = json::parse(text);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number too large
      fail(path, ": invalid JSON (", e.what(), ")");
    }
    for (size_t i = 0; i < records.size(); ++i)
      read_record(records[i].dump(), path + ": record " + std::to_string(i));
    return;
  }
  for_each_line(text, [&](std::string_view line, int64_t number, size_t, size_t) {
    if (!is_blank(line)) read_record(line, path + ":" + std::to_string(number));
  });
}

Corpus read_corpus(const std::vector<std::string>& paths, const CorpusOptions& options) {
  Corpus corpus;
  std::set<fs::path> seen;  // canonical paths already read: a file is read once
  auto read_once = [&](const fs::path& file) {
    std::error_code ec;
    fs::path canonical = fs::canonical(file, ec);
    if (ec) canonical = file;
    if (!seen.insert(canonical).second) {
      ++corpus.stats.skipped_files;
      return;
    }
    read_corpus_file(file.string(), options, corpus);
  };
  for (const std::string& path : paths) {
    std::error_code ec;
    fs::file_status status = fs::status(path, ec);
    if (ec || !fs::exists(status)) fail("corpus input '", path, "' does not exist");
    if (fs::is_regular_file(status)) {
      read_once(path);
      continue;
    }
    if (!fs::is_directory(status))
      fail("corpus input '", path, "' is neither a regular file nor a directory");
    std::vector<fs::path> files;
    fs::recursive_directory_iterator it(path, fs::directory_options::skip_permission_denied, ec);
    if (ec) fail("cannot list corpus directory '", path, "': ", ec.message());
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) fail("cannot list corpus directory '", path, "': ", ec.message());
      const std::string name = it->path().filename().string();
      if (!name.empty() && name[0] == '.') {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file(ec)) files.push_back(it->path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      const std::string name = file.string();
      if (ends_with(name, ".dat")) {
        ++corpus.stats.skipped_files;
        continue;
      }
      // Binary files inside a directory are passed over (only explicit paths are errors).
      std::ifstream probe(file, std::ios::binary);
      std::string head(8192, '\0');
      probe.read(head.data(), static_cast<std::streamsize>(head.size()));
      head.resize(static_cast<size_t>(probe.gcount()));
      if (binary_marker(head) != std::string::npos) {
        ++corpus.stats.skipped_files;
        continue;
      }
      read_once(file);
    }
  }
  return corpus;
}

}  // namespace frugal
