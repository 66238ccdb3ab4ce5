// tokenizer.json: reading (what is supported, and refusing the rest by name), then the
// encode and decode pipelines of HF tokenizers for byte-level BPE.
#include "data/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/regular_file.h"
#include "data/corpus.h"
#include "data/unicode_text.h"

namespace frugal {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Reader {
  std::string source;  // the file, for messages

  [[noreturn]] void refuse(const std::string& what) const {
    fail(source, ": ", what,
         "; frugal reads byte-level BPE tokenizer.json files (Llama 3, Qwen2): see "
         "doc/hf-interop.md");
  }
  std::string type_of(const json& j, const std::string& where) const {
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
      fail(source, ": ", where, " has no \"type\" (", j.dump().substr(0, 200), ")");
    return j["type"].get<std::string>();
  }
  bool flag(const json& j, const char* key, bool default_value) const {
    if (!j.contains(key) || j[key].is_null()) return default_value;
    if (!j[key].is_boolean())
      fail(source, ": key '", key, "' has value ", j[key].dump(), ", expected true or false");
    return j[key].get<bool>();
  }
  std::string string_or_empty(const json& j, const char* key) const {
    if (!j.contains(key) || j[key].is_null()) return "";
    if (!j[key].is_string())
      fail(source, ": key '", key, "' has value ", j[key].dump(), ", expected a string");
    return j[key].get<std::string>();
  }
};

json read_json(const std::string& path) {
  require_regular_file(path, "tokenizer");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("tokenizer '", path, "' does not exist or cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    fail("tokenizer '", path, "' is not valid JSON: ", e.what());
  }
}

// A literal Split pattern as a regex: every ASCII punctuation character escaped.
std::string escape_literal(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c)))
      out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace

HfTokenizer::~HfTokenizer() = default;

// The reader checks the type of every value it branches on; a value of another type that it
// reads without looking (a number where a string belongs) is still refused by name here, not
// passed on as nlohmann's exception.
HfTokenizer::HfTokenizer(const std::string& path) try : path_(path) {
  const Reader r{"tokenizer '" + path + "'"};
  const json j = read_json(path);
  if (!j.is_object() || !j.contains("model"))
    fail(r.source, ": not a tokenizer.json (no \"model\" object)");

  // The model: BPE with what byte-level tokenizers use.
  const json& m = j["model"];
  const std::string model_type = r.type_of(m, "model");
  if (model_type != "BPE") r.refuse("model type '" + model_type + "' is not supported (only BPE)");
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    r.refuse("BPE dropout " + m["dropout"].dump() + " is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!r.string_or_empty(m, key).empty())
      r.refuse(std::string("BPE ") + key + " '" + r.string_or_empty(m, key) + "' is not supported");
  if (r.flag(m, "byte_fallback", false)) r.refuse("BPE byte_fallback is not supported");
  if (!m.contains("vocab") || !m["vocab"].is_object())
    fail(r.source, ": model has no \"vocab\" object");
  std::unordered_map<std::string, int32_t> vocab;
  int32_t max_id = -1;
  for (const auto& [token, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      fail(r.source, ": vocabulary entry '", token, "' has id ", id.dump(),
           ", expected a non-negative integer");
    vocab[token] = id.get<int32_t>();
    max_id = std::max(max_id, id.get<int32_t>());
  }
  if (!m.contains("merges") || !m["merges"].is_array())
    fail(r.source, ": model has no \"merges\" list");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(m["merges"].size());
  for (const json& merge : m["merges"]) {
    // "a b" (the files on the Hub) or ["a", "b"] (tokenizers 0.20 and later).
    if (merge.is_string()) {
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail(r.source, ": merge '", s, "' is not two tokens separated by one space");
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      fail(r.source, ": merge ", merge.dump(), " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  BpeSettings settings;
  settings.ignore_merges = r.flag(m, "ignore_merges", false);
  settings.fuse_unk = r.flag(m, "fuse_unk", false);
  const std::string unk = r.string_or_empty(m, "unk_token");
  if (!unk.empty()) {
    auto it = vocab.find(unk);
    if (it == vocab.end()) fail(r.source, ": unk_token '", unk, "' is not in the vocabulary");
    settings.unk_id = unk_id_ = it->second;
  }

  // The normalizer: none, or NFC (alone or in a Sequence).
  auto read_normalizer = [&](const json& n, auto&& self) -> void {
    if (n.is_null()) return;
    const std::string type = r.type_of(n, "normalizer");
    if (type == "NFC") {
      nfc_ = true;
    } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
      for (const json& inner : n["normalizers"]) self(inner, self);
    } else {
      r.refuse("normalizer type '" + type + "' is not supported (only NFC, or none)");
    }
  };
  if (j.contains("normalizer")) read_normalizer(j["normalizer"], read_normalizer);

  // Added tokens: matched before anything else; special ones dropped by decode.
  std::vector<std::pair<std::string, int32_t>> added;
  // HF gives an added token the id of the same text in the vocabulary, else the next one after
  // the vocabulary, whatever the file says (with a warning): a file that disagrees is refused.
  auto next_id = static_cast<int32_t>(vocab.size());
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    for (const json& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string() || t["id"].get<int64_t>() < 0 ||
          t["id"].get<int64_t>() > INT32_MAX)
        fail(r.source, ": added token ", t.dump(), " lacks an integer id or a string content");
      const std::string content = t["content"].get<std::string>();
      const auto id = t["id"].get<int32_t>();
      if (content.empty()) continue;  // HF ignores it
      int32_t hf_id;
      if (auto it = added_ids_.find(content); it != added_ids_.end())
        hf_id = it->second;
      else if (auto in_vocab = vocab.find(content); in_vocab != vocab.end())
        hf_id = in_vocab->second;
      else
        hf_id = next_id++;
      if (id != hf_id)
        fail(r.source, ": added token '", content, "' has id ", id,
             ", but HF tokenizers reads it as ", hf_id,
             " (its vocabulary id, or the next id after the vocabulary of ", vocab.size(),
             " tokens and the added tokens before it): the file is inconsistent");
      for (const char* key : {"single_word", "lstrip", "rstrip"})
        if (r.flag(t, key, false))
          r.refuse("added token '" + content + "' has " + key + " set, which is not supported");
      const bool special = r.flag(t, "special", false);
      // HF's default: special tokens are matched in the raw text, others after normalizing.
      const bool normalized = r.flag(t, "normalized", !special);
      if (special) special_tokens_.insert(content);
      added_ids_[content] = id;
      added.emplace_back(content, id);
      // Normalized ones are looked for in normalized text, so in their normalized form.
      if (normalized)
        normalized_tokens_.add(nfc_ ? nfc_normalize(content) : content, id);
      else
        raw_tokens_.add(content, id);
      max_id = std::max(max_id, id);
    }
  }

  // The pre-tokenizer: Split regexes, then ByteLevel without its own regex.
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
    r.refuse("there is no pre_tokenizer (a byte-level tokenizer ends with a ByteLevel one)");
  std::vector<json> steps;
  const json& pre = j["pre_tokenizer"];
  if (r.type_of(pre, "pre_tokenizer") == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array())
      fail(r.source, ": pre_tokenizer Sequence has no \"pretokenizers\" list");
    for (const json& step : pre["pretokenizers"]) steps.push_back(step);
  } else {
    steps.push_back(pre);
  }
  bool byte_level = false;
  for (const json& step : steps) {
    const std::string type = r.type_of(step, "pre_tokenizer");
    if (byte_level) r.refuse("pre_tokenizer '" + type + "' after ByteLevel is not supported");
    if (type == "Split") {
      const std::string behavior = r.string_or_empty(step, "behavior");
      if (behavior != "Isolated")
        r.refuse("pre_tokenizer Split with behavior '" + behavior +
                 "' is not supported (only Isolated)");
      if (r.flag(step, "invert", false))
        r.refuse("pre_tokenizer Split with invert is not supported");
      const json& pattern = step.contains("pattern") ? step["pattern"] : json();
      if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string())
        splits_.emplace_back(pattern["Regex"].get<std::string>(),
                             r.source + ": pre_tokenizer Split pattern");
      else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string())
        splits_.emplace_back(escape_literal(pattern["String"].get<std::string>()),
                             r.source + ": pre_tokenizer Split string");
      else
        fail(r.source, ": pre_tokenizer Split has pattern ", pattern.dump(),
             ", expected {\"Regex\": ...} or {\"String\": ...}");
    } else if (type == "ByteLevel") {
      if (r.flag(step, "add_prefix_space", true))
        r.refuse("pre_tokenizer ByteLevel with add_prefix_space is not supported");
      if (r.flag(step, "use_regex", true))
        r.refuse(
            "pre_tokenizer ByteLevel with use_regex (GPT-2's built-in pattern) is not "
            "supported (Llama 3 and Qwen2 split with a Split pre-tokenizer instead)");
      byte_level = true;
    } else {
      r.refuse("pre_tokenizer type '" + type + "' is not supported (only Split and ByteLevel)");
    }
  }
  if (!byte_level) r.refuse("the pre_tokenizer does not end with ByteLevel");

  // The decoder: ByteLevel (its options change offsets, not text).
  if (!j.contains("decoder") || j["decoder"].is_null())
    r.refuse("there is no decoder (expected ByteLevel)");
  const std::string decoder = r.type_of(j["decoder"], "decoder");
  if (decoder != "ByteLevel")
    r.refuse("decoder type '" + decoder + "' is not supported (only ByteLevel)");

  model_ = std::make_unique<BytePairModel>(std::move(vocab), merges, settings, r.source);
  // Ids index the model's embedding and run from 0 without gaps in a real tokenizer.json; one far
  // past the number of tokens would make a table of mostly nothing (an id of 2^31: 64 GiB).
  const size_t tokens = model_->vocab().size() + added.size();
  if (max_id >= 0 && size_t(max_id) >= 2 * tokens + 1024)
    fail(r.source, ": id ", max_id, " is far past its ", tokens,
         " tokens (a tokenizer's ids run from 0 without gaps)");
  id_to_token_.assign(size_t(max_id + 1), std::nullopt);
  for (const auto& [token, id] : model_->vocab()) id_to_token_[size_t(id)] = token;
  for (const auto& [content, id] : added) id_to_token_[size_t(id)] = content;

  // bos from the TemplateProcessing post-processor, if one adds a token before the text.
  std::vector<json> processors;
  if (j.contains("post_processor") && j["post_processor"].is_object()) {
    const json& p = j["post_processor"];
    if (p.value("type", "") == "Sequence" && p.contains("processors") && p["processors"].is_array())
      for (const json& inner : p["processors"]) processors.push_back(inner);
    else
      processors.push_back(p);
  }
  for (const json& p : processors)
    if (p.value("type", "") == "TemplateProcessing" && p.contains("single") &&
        p["single"].is_array() && !p["single"].empty() && p["single"][0].contains("SpecialToken")) {
      const std::string bos = p["single"][0]["SpecialToken"].value("id", "");
      bos_id_ = template_bos_id_ = id_of(bos);
    }

  // tokenizer_config.json next to the file names bos, eos and pad as transformers reads them.
  const fs::path config_path = fs::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;  // anything there is read (and refused by name when it is no file)
  if (fs::symlink_status(config_path, ec).type() != fs::file_type::not_found) {
    const json config = read_json(config_path.string());
    auto token_key = [&](const char* key, int32_t& id) {
      if (!config.contains(key) || config[key].is_null()) return;
      const json& v = config[key];
      const json& content = v.is_object() && v.contains("content") ? v["content"] : v;
      if (!content.is_string())
        fail("'", config_path.string(), "': key '", key, "' has value ", v.dump(),
             ", expected a token string");
      id = id_of(content.get<std::string>());
      if (id < 0)
        fail("'", config_path.string(), "': ", key, " '", content.get<std::string>(),
             "' is not a token of '", path, "'");
    };
    token_key("bos_token", bos_id_);
    token_key("eos_token", eos_id_);
    token_key("pad_token", pad_id_);
    token_key("unk_token", unk_id_);
  }
} catch (const nlohmann::json::exception& e) {
  fail("tokenizer '", path, "': a value of the wrong type or out of range (", e.what(), ")");
}

int32_t HfTokenizer::id_of(const std::string& token) const {
  if (auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  if (auto it = model_->vocab().find(token); it != model_->vocab().end()) return it->second;
  return -1;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view input) const {
  // transformers tokenizes str, never bytes: text that is not UTF-8 gets the U+FFFD that
  // decoding it with errors="replace" gives.
  std::string repaired;
  std::string_view text = input;
  if (!is_valid_utf8(input)) {
    repaired = replace_invalid_utf8(input);
    text = repaired;
  }
  std::vector<int32_t> ids;
  for (const auto& segment : raw_tokens_.split(text)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    const std::string_view plain = text.substr(segment.begin, segment.end - segment.begin);
    if (!nfc_) {
      encode_text(plain, ids, nullptr);
      continue;
    }
    const std::string normalized = nfc_normalize(plain);
    encode_text(normalized, ids, nullptr);
  }
  return ids;
}

// Normalized text: normalized added tokens, then the pre-tokenizers and the model. With
// `ends`, also each token's end offset in `text`.
void HfTokenizer::encode_text(std::string_view text, std::vector<int32_t>& ids,
                              std::vector<size_t>* ends) const {
  for (const auto& segment : normalized_tokens_.split(text)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      if (ends) ends->push_back(segment.end);
      continue;
    }
    std::vector<std::string_view> words{text.substr(segment.begin, segment.end - segment.begin)};
    for (const UnicodeRegex& split : splits_) {
      std::vector<std::string_view> finer;
      for (std::string_view word : words) {
        size_t last = 0;
        for (const auto& [begin, end] : split.find_all(word)) {
          if (last < begin) finer.push_back(word.substr(last, begin - last));
          finer.push_back(word.substr(begin, end - begin));
          last = end;
        }
        if (last < word.size()) finer.push_back(word.substr(last));
      }
      words = std::move(finer);
    }
    for (std::string_view word : words) {
      const size_t first = ids.size();
      encode_word(word, ids);
      if (!ends) continue;
      // A word's tokens spell its bytes in order, each the bytes its characters stand for.
      size_t at = static_cast<size_t>(word.data() - text.data());
      const size_t word_end = at + word.size();
      for (size_t k = first; k < ids.size(); ++k) {
        const std::optional<std::string>& token = id_to_token_[size_t(ids[k])];
        const std::optional<std::string> bytes = token ? alphabet_.decode(*token) : std::nullopt;
        at = std::min(word_end, at + (bytes ? bytes->size() : 0));
        ends->push_back(k + 1 == ids.size() ? word_end : at);
      }
    }
  }
}

void HfTokenizer::encode_template_output(std::string_view text, TokenSpans& out) const {
  // Records are valid JSON, hence UTF-8; a template that cuts a message by bytes (minja slices
  // bytes, Jinja2 characters) can break a character.
  if (!is_valid_utf8(text))
    fail("tokenizer '", path_, "': the chat template's output is not valid UTF-8 (a template that ",
         "cuts text through a character)");
  for (const auto& segment : raw_tokens_.split(text)) {
    if (segment.id >= 0) {
      out.push(segment.id, segment.begin, segment.end);
      continue;
    }
    const std::string_view plain = text.substr(segment.begin, segment.end - segment.begin);
    std::vector<int32_t> ids;
    std::vector<size_t> ends;
    if (!nfc_) {
      encode_text(plain, ids, &ends);
      for (size_t k = 0; k < ids.size(); ++k)
        out.push(ids[k], segment.begin + (k ? ends[k - 1] : 0), segment.begin + ends[k]);
      continue;
    }
    const NfcText normalized(plain);
    encode_text(normalized.text(), ids, &ends);
    for (size_t k = 0; k < ids.size(); ++k)
      out.push(ids[k], segment.begin + normalized.original_begin(k ? ends[k - 1] : 0),
               segment.begin + normalized.original_end(ends[k]));
  }
}

void HfTokenizer::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  model_->encode_word(alphabet_.encode(word), ids);
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::optional<std::string>& token = id_to_token_[size_t(id)];
    if (!token)
      fail("tokenizer '", path_, "': id ", id, " is a gap in the vocabulary (no token has it)");
    if (special_tokens_.count(*token)) continue;  // skip_special_tokens=True
    // HF's ByteLevel decoder: a token whose characters are all in the alphabet stands for
    // those bytes; any other (an added token such as "<|a b|>") for its own UTF-8.
    if (std::optional<std::string> raw = alphabet_.decode(*token))
      bytes += *raw;
    else
      bytes += *token;
  }
  return replace_invalid_utf8(bytes);
}

std::string HfTokenizer::piece(int32_t id) const {
  const std::optional<std::string>& token = id_to_token_[size_t(id)];
  return token ? *token : std::string();
}

}  // namespace frugal
