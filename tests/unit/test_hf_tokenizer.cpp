// tokenizer.json (byte-level BPE) against HF tokenizers: the committed fixtures of
// tools/make_bpe_fixtures.py (a Llama-3-style and a Qwen2-style tokenizer trained small with
// the real pre-tokenizers and special tokens; 10,240 lines of mixed text with HF's ids and
// decodes; edge cases), the choice of tokenizer kind, and the refusals.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "data/tokenizer.h"
#include "data/unicode_text.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace frugal;
using frugal::test::contains;
using frugal::test::error_of;
using frugal::test::TempDir;

namespace {

const fs::path kFixtures = fs::path(FRUGAL_SOURCE_DIR) / "tests/fixtures/bpe";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Lines without their '\n' (the file ends with one).
std::vector<std::string> read_lines(const fs::path& path) {
  const std::string text = read_file(path);
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t nl; (nl = text.find('\n', begin)) != std::string::npos; begin = nl + 1)
    lines.push_back(text.substr(begin, nl - begin));
  REQUIRE(begin == text.size());
  return lines;
}

std::vector<std::vector<int32_t>> read_ids(const fs::path& path) {
  std::vector<std::vector<int32_t>> all;
  for (const std::string& line : read_lines(path)) {
    std::istringstream in(line);
    std::vector<int32_t> ids;
    for (int32_t id; in >> id;) ids.push_back(id);
    all.push_back(std::move(ids));
  }
  return all;
}

std::string show(const std::vector<int32_t>& ids, size_t from = 0) {
  std::string s;
  for (size_t i = from; i < ids.size() && i < from + 40; ++i) s += std::to_string(ids[i]) + " ";
  return s;
}

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    const unsigned char le[4] = {
        static_cast<unsigned char>(id), static_cast<unsigned char>(id >> 8),
        static_cast<unsigned char>(id >> 16), static_cast<unsigned char>(id >> 24)};
    h = fnv1a64(le, 4, h);
  }
  return h;
}

std::string hex(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof(s), "%016llx", static_cast<unsigned long long>(v));
  return s;
}

void check_parity(const std::string& name) {
  const Tokenizer tok((kFixtures / name / "tokenizer.json").string());
  CHECK(tok.kind() == TokenizerKind::byte_level_bpe);
  const std::vector<std::string> lines = read_lines(kFixtures / "mixed.txt");
  const auto expected = read_ids(kFixtures / (name + ".ids"));
  REQUIRE(lines.size() >= 10000);
  REQUIRE(expected.size() == lines.size());

  // HF's decode where it differs from the line's own bytes.
  std::vector<std::string> decoded_expected = lines;
  size_t overrides = 0;
  for (const std::string& row : read_lines(kFixtures / (name + ".decoded.jsonl"))) {
    const auto j = nlohmann::json::parse(row);
    decoded_expected.at(j["line"].get<size_t>()) = j["text"].get<std::string>();
    ++overrides;
  }
  INFO(name << ": " << lines.size() << " lines, " << overrides << " decode to other text");

  size_t id_mismatches = 0, decode_mismatches = 0, total_ids = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::vector<int32_t> ids = tok.encode(lines[i]);
    total_ids += ids.size();
    if (ids != expected[i]) {
      if (++id_mismatches <= 3) {
        size_t k = 0;
        while (k < ids.size() && k < expected[i].size() && ids[k] == expected[i][k]) ++k;
        UNSCOPED_INFO("line " << i << " differs from id " << k << ": frugal " << show(ids, k)
                              << "| HF " << show(expected[i], k));
      }
    }
    if (tok.decode(expected[i]) != decoded_expected[i] && ++decode_mismatches <= 3)
      UNSCOPED_INFO("line " << i << " decodes differently");
  }
  CHECK(id_mismatches == 0);
  CHECK(decode_mismatches == 0);
  CHECK(total_ids > 150000);
}

void check_edges(const std::string& name) {
  const Tokenizer tok((kFixtures / name / "tokenizer.json").string());
  const auto cases = nlohmann::json::parse(read_file(kFixtures / (name + ".edge.json")));
  REQUIRE(cases.size() >= 6);
  for (const auto& c : cases) {
    std::string text = c["prefix"].get<std::string>();
    for (int64_t i = 0; i < c["times"].get<int64_t>(); ++i) text += c["unit"].get<std::string>();
    text += c["suffix"].get<std::string>();
    INFO(name << ": " << c["name"].get<std::string>() << " (" << text.size() << " bytes)");
    const std::vector<int32_t> ids = tok.encode(text);
    CHECK(ids.size() == c["count"].get<size_t>());
    CHECK(hex(fnv1a64(ids)) == c["fnv1a64"].get<std::string>());
    const auto first = c["first"].get<std::vector<int32_t>>();
    const auto last = c["last"].get<std::vector<int32_t>>();
    CHECK(std::vector<int32_t>(ids.begin(), ids.begin() + std::min(ids.size(), first.size())) ==
          first);
    CHECK(std::vector<int32_t>(ids.end() - std::min(ids.size(), last.size()), ids.end()) == last);
    const std::string decoded = tok.decode(ids);
    CHECK(decoded.size() == c["decoded_bytes"].get<size_t>());
    CHECK(hex(fnv1a64(decoded.data(), decoded.size())) == c["decoded_fnv1a64"].get<std::string>());
  }
}

}  // namespace

TEST_CASE("tokenizer.json: Llama 3 style equals HF tokenizers on 10,240 mixed lines",
          "[data][tokenizer][bpe]") {
  check_parity("llama3");
}

TEST_CASE("tokenizer.json: Qwen2 style (NFC) equals HF tokenizers on 10,240 mixed lines",
          "[data][tokenizer][bpe]") {
  check_parity("qwen2");
}

TEST_CASE("tokenizer.json: edge cases equal HF (empty, only specials, long runs, 1 MB line)",
          "[data][tokenizer][bpe]") {
  check_edges("llama3");
  check_edges("qwen2");
}

TEST_CASE("tokenizer.json: a long text encoded piece by piece gives the ids of the whole",
          "[data][tokenizer]") {
  // The mixed lines as one text (every kind of whitespace run, CJK, emoji, specials, invalid
  // UTF-8 repaired per line so the pieces' cuts stay inside valid text).
  std::string text;
  for (const std::string& line : read_lines(kFixtures / "mixed.txt"))
    text += replace_invalid_utf8(line) + "\n";
  for (const std::string name : {"llama3", "qwen2"}) {
    const Tokenizer tok((kFixtures / name / "tokenizer.json").string());
    int64_t pieces = 0;
    CHECK(tok.encode_long(
              text, [&](int64_t) { ++pieces; }, 4096) == tok.encode(text));
    CHECK(pieces > 100);
    // One line: cut before lone spaces.
    std::string one_line = text;
    std::replace(one_line.begin(), one_line.end(), '\n', ' ');
    pieces = 0;
    CHECK(tok.encode_long(
              one_line, [&](int64_t) { ++pieces; }, 4096) == tok.encode(one_line));
    CHECK(pieces > 100);
  }
}

TEST_CASE("tokenizer.json: invalid UTF-8 repaired as Python's errors='replace'",
          "[data][tokenizer][bpe]") {
  // Each value is what bytes.decode("utf-8", errors="replace") gives (Python 3.11).
  const std::string r = "\xEF\xBF\xBD";
  CHECK(replace_invalid_utf8("\xE2\x82"
                             "A") == r + "A");
  CHECK(replace_invalid_utf8("\xC0\xAF") == r + r);
  CHECK(replace_invalid_utf8("\xED\xA0\x80") == r + r + r);
  CHECK(replace_invalid_utf8("\xF4\x90\x80\x80") == r + r + r + r);
  CHECK(replace_invalid_utf8("\xF0\x9F\x98") == r);
  CHECK(replace_invalid_utf8("\xE1\x80\xE2\x80\xA0") == r + "\xE2\x80\xA0");
  CHECK(replace_invalid_utf8("\xFF\xFE") == r + r);
  CHECK(replace_invalid_utf8("a\xF0(\x8C\xBC") == "a" + r + "(" + r + r);
  const std::string valid = "caf\xC3\xA9 \xF0\x9F\x98\x80 \xE4\xBD\xA0";
  CHECK(replace_invalid_utf8(valid) == valid);
  CHECK(replace_invalid_utf8(std::string("a\0b", 3)) == std::string("a\0b", 3));
  // NFC: e + combining acute -> é; Å (U+212B) -> Å (U+00C5).
  CHECK(nfc_normalize("e\xCC\x81") == "\xC3\xA9");
  CHECK(nfc_normalize("\xE2\x84\xAB") == "\xC3\x85");
}

TEST_CASE("tokenizer kind: chosen from the file, found in a directory, copied with its config",
          "[data][tokenizer][bpe]") {
  TempDir dir;
  const std::string llama3 = (kFixtures / "llama3/tokenizer.json").string();
  const std::string qwen2 = (kFixtures / "qwen2/tokenizer.json").string();
  CHECK(tokenizer_kind_of(llama3) == TokenizerKind::byte_level_bpe);
  CHECK(find_tokenizer(dir.path.string()).empty());

  // bos and eos: Llama 3's from tokenizer_config.json, Qwen2 has eos only.
  const Tokenizer l3(llama3), q2(qwen2);
  CHECK(l3.vocab_size() == 3406);
  CHECK(l3.bos_id() == 3150);  // <|begin_of_text|>, the first added token
  CHECK(l3.eos_id() == 3151);
  CHECK(l3.piece(3159) == "<|eot_id|>");
  CHECK(q2.bos_id() == -1);
  CHECK(q2.eos_id() == 3000);
  CHECK(q2.pad_id() == 3000);
  CHECK(q2.vocab_size() == 3006);
  // A special token is dropped by decode, a plain added token kept (skip_special_tokens).
  CHECK(q2.decode(q2.encode("<|im_start|>hi<tool_call>x<|im_end|>")) == "hi<tool_call>x");
  CHECK(contains(error_of([&] { q2.decode({3006}); }), "outside the vocabulary [0, 3006)"));

  // Copied alone, the tokenizer.json still knows bos from its TemplateProcessing.
  fs::copy_file(llama3, dir.file("tokenizer.json"));
  CHECK(find_tokenizer(dir.path.string()) == dir.file("tokenizer.json"));
  const Tokenizer alone(dir.file("tokenizer.json"));
  CHECK(alone.bos_id() == 3150);
  CHECK(alone.eos_id() == -1);

  // copy_tokenizer takes tokenizer_config.json along.
  fs::create_directories(dir.path / "data");
  const std::string copied = copy_tokenizer(qwen2, (dir.path / "data").string());
  CHECK(copied == (dir.path / "data/tokenizer.json").string());
  CHECK(fs::is_regular_file(dir.path / "data/tokenizer_config.json"));
  CHECK(Tokenizer(copied).eos_id() == 3000);
  CHECK(copy_tokenizer(copied, (dir.path / "data").string()) == copied);  // onto itself

  // A directory with both files is a Llama 1/2 one: the SentencePiece model wins.
  std::ofstream(dir.file("tokenizer.model")) << "x";
  CHECK(find_tokenizer(dir.path.string()) == dir.file("tokenizer.model"));
  CHECK(tokenizer_kind_of(dir.file("tokenizer.model")) == TokenizerKind::sentencepiece);

  // Copying a tokenizer.json where a tokenizer.model is removes the old one, so that the new
  // one is found.
  std::ofstream(dir.path / "data/tokenizer.model") << "stale";
  copy_tokenizer(llama3, (dir.path / "data").string());
  CHECK_FALSE(fs::exists(dir.path / "data/tokenizer.model"));
  CHECK(find_tokenizer((dir.path / "data").string()) == copied);
  CHECK(Tokenizer(copied).bos_id() == 3150);
}

TEST_CASE("tokenizer.json: normalized added tokens, characters outside the vocabulary",
          "[data][tokenizer][bpe]") {
  // The fuzz seeds: an 18-token vocabulary with "café" as a normalized (non-special) added
  // token. Expected ids from HF tokenizers 0.23.3: with NFC, "cafe" + U+0301 finds "café"; with
  // no normalizer it does not, and characters outside the vocabulary (no unk) are dropped.
  const fs::path seeds = fs::path(FRUGAL_SOURCE_DIR) / "tests/fuzz/corpus/tokenizer_json";
  const Tokenizer l3((seeds / "llama3_style.json").string());
  const Tokenizer q2((seeds / "qwen2_style.json").string());
  for (const Tokenizer* t : {&l3, &q2}) {
    CHECK(t->encode("Hello it's caf\xC3\xA9") == std::vector<int32_t>{15, 17, 7, 8, 4, 20});
    CHECK(t->encode("xcaf\xC3\xA9x") == std::vector<int32_t>{20});
  }
  CHECK(l3.encode("cafe\xCC\x81<|begin_of_text|>Hell") == std::vector<int32_t>{1, 18, 14});
  CHECK(q2.encode("cafe\xCC\x81<|begin_of_text|>Hell") == std::vector<int32_t>{20, 18, 14});
}

TEST_CASE("tokenizer.json: what frugal does not implement is refused by name",
          "[data][tokenizer][bpe]") {
  TempDir dir;
  const auto original = nlohmann::json::parse(read_file(kFixtures / "llama3/tokenizer.json"));
  auto error_with = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = original;
    change(j);
    std::ofstream(dir.file("tokenizer.json")) << j.dump();
    return error_of([&] { Tokenizer t(dir.file("tokenizer.json")); });
  };
  CHECK(error_with([](nlohmann::json&) {}).empty());
  CHECK(contains(error_with([](auto& j) { j["model"]["type"] = "WordPiece"; }),
                 "model type 'WordPiece' is not supported"));
  CHECK(contains(error_with([](auto& j) { j["model"]["type"] = "Unigram"; }),
                 "model type 'Unigram'"));
  CHECK(contains(error_with([](auto& j) {
                   j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}};
                 }),
                 "pre_tokenizer type 'Metaspace' is not supported"));
  CHECK(contains(error_with([](auto& j) {
                   j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Whitespace"}};
                 }),
                 "pre_tokenizer type 'Whitespace'"));
  CHECK(contains(
      error_with([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }),
      "Split with behavior 'Removed'"));
  CHECK(contains(error_with([](auto& j) {
                   j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}";
                 }),
                 "does not compile"));
  CHECK(contains(
      error_with([](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; }),
      "ByteLevel with use_regex"));
  CHECK(contains(error_with([](auto& j) {
                   j["normalizer"] = {{"type", "Lowercase"}};
                 }),
                 "normalizer type 'Lowercase'"));
  CHECK(contains(error_with([](auto& j) {
                   j["decoder"] = {{"type", "Metaspace"}};
                 }),
                 "decoder type 'Metaspace'"));
  CHECK(contains(error_with([](auto& j) { j["model"]["byte_fallback"] = true; }), "byte_fallback"));
  CHECK(contains(error_with([](auto& j) { j["model"]["dropout"] = 0.1; }), "dropout"));
  CHECK(contains(error_with([](auto& j) { j["added_tokens"][5]["lstrip"] = true; }),
                 "added token '<|reserved_special_token_3|>' has lstrip"));
  CHECK(contains(error_with([](auto& j) { j["model"]["merges"][0] = "Ġ zzzq"; }),
                 "'zzzq', which is not in the vocabulary"));
  CHECK(contains(error_with([](auto& j) { j["model"].erase("type"); }), "model has no \"type\""));
  CHECK(contains(error_with([](auto& j) { j["added_tokens"][1]["id"] = 5000; }),
                 "added token '<|end_of_text|>' has id 5000, but HF tokenizers reads it as 3151"));
  std::ofstream(dir.file("broken.json")) << "{\"model\": ";
  CHECK(contains(error_of([&] { Tokenizer t(dir.file("broken.json")); }), "is not valid JSON"));
  CHECK(contains(error_of([&] { Tokenizer t(dir.file("missing.json")); }), "missing.json"));
}
