// A SentencePiece model encoding a chat template's output as transformers' LlamaTokenizer
// does: special tokens matched in the text, and the prefix space only where it puts one.
#include <sentencepiece_processor.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regular_file.h"
#include "data/sentencepiece_model.h"

namespace frugal {

namespace fs = std::filesystem;

namespace {

// Protocol buffer wire format, as far as a model proto needs it.
uint64_t read_varint(std::string_view bytes, size_t& at) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (at >= bytes.size()) fail("truncated varint");
    const auto byte = static_cast<unsigned char>(bytes[at++]);
    value |= uint64_t(byte & 0x7F) << shift;
    if (!(byte & 0x80)) return value;
  }
  fail("varint longer than 10 bytes");
}

void write_varint(uint64_t value, std::string& out) {
  do {
    const auto low = static_cast<unsigned char>(value & 0x7F);
    value >>= 7;
    out.push_back(static_cast<char>(value ? (low | 0x80) : low));
  } while (value);
}

// The model proto with NormalizerSpec.add_dummy_prefix = false: the spec (ModelProto field 3)
// gets the field (3, varint 0) appended, which protocol buffers read as the last word on it.
// The alternative, libprotobuf and SentencePiece's .proto (which Debian does not ship), would
// be a code generator for one boolean.
std::string without_dummy_prefix(std::string_view model) {
  constexpr uint64_t kNormalizerSpec = 3;
  const std::string override_field = {char((3 << 3) | 0), char(0)};  // add_dummy_prefix: false
  std::string out;
  bool patched = false;
  for (size_t at = 0; at < model.size();) {
    const size_t field_begin = at;
    const uint64_t key = read_varint(model, at);
    const uint64_t field = key >> 3, wire_type = key & 7;
    switch (wire_type) {
      case 0:
        read_varint(model, at);
        break;
      case 1:
        at += 8;
        break;
      case 5:
        at += 4;
        break;
      case 2: {
        const uint64_t length = read_varint(model, at);
        if (length > model.size() - at) fail("a field runs past the end of the model");
        if (field == kNormalizerSpec) {
          write_varint(key, out);
          write_varint(length + override_field.size(), out);
          out.append(model.substr(at, length));
          out += override_field;
          patched = true;
          at += length;
          continue;
        }
        at += length;
        break;
      }
      default:
        fail("wire type ", wire_type, " is not protocol buffers'");
    }
    if (at > model.size()) fail("a field runs past the end of the model");
    out.append(model.substr(field_begin, at - field_begin));
  }
  if (!patched) {  // no normalizer spec at all: one holding just the override
    write_varint((kNormalizerSpec << 3) | 2, out);
    write_varint(override_field.size(), out);
    out += override_field;
  }
  return out;
}

}  // namespace

void SentencePieceModel::read_special_tokens() {
  for (int id = 0; id < processor_->GetPieceSize(); ++id)
    if (processor_->IsControl(id) || processor_->IsUnknown(id))
      special_tokens_.add(processor_->IdToPiece(id), id);
  // transformers 5's LlamaTokenizer: Metaspace(prepend_scheme = "first" unless legacy, or
  // "never" without add_prefix_space), whatever a tokenizer.json beside the model says.
  const fs::path config_path = fs::path(path_).parent_path() / "tokenizer_config.json";
  if (non_regular_kind(config_path.string()) == "missing") return;
  const std::string text = read_regular_file(config_path.string(), "tokenizer config");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("'", config_path.string(), "' is not valid JSON: ", e.what());
  }
  const auto flag = [&](const char* key, bool default_value) {
    if (!config.is_object() || !config.contains(key) || config[key].is_null()) return default_value;
    if (!config[key].is_boolean())
      fail("'", config_path.string(), "': key '", key, "' has value ", config[key].dump(),
           ", expected true or false");
    return config[key].get<bool>();
  };
  prefix_space_ = !flag("add_prefix_space", true) ? PrefixSpace::never
                  : flag("legacy", false)         ? PrefixSpace::always
                                                  : PrefixSpace::first;
}

const sentencepiece::SentencePieceProcessor& SentencePieceModel::without_prefix_space() const {
  std::call_once(without_prefix_once_, [this] {
    auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
    std::string patched;
    try {
      patched = without_dummy_prefix(processor_->serialized_model_proto());
    } catch (const Error& e) {
      fail("tokenizer model '", path_, "': cannot read its model proto: ", e.what());
    }
    const auto status = processor->LoadFromSerializedProto(patched);
    if (!status.ok())
      fail("tokenizer model '", path_,
           "' without its prefix space does not load: ", status.ToString());
    without_prefix_ = std::move(processor);
  });
  return *without_prefix_;
}

std::vector<int32_t> SentencePieceModel::encode_continuing(std::string_view text) const {
  std::vector<int> ids;
  const auto status = without_prefix_space().Encode(text, &ids);
  if (!status.ok()) fail("tokenizer '", path_, "': encoding failed: ", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

void SentencePieceModel::encode_template_output(std::string_view text, TokenSpans& out) const {
  for (const auto& segment : special_tokens_.split(text)) {
    if (segment.id >= 0) {
      out.push(segment.id, segment.begin, segment.end);
      continue;
    }
    // Metaspace puts "▁" only before text that does not start with a space already; the
    // dummy prefix goes before any text.
    const bool prefix = (prefix_space_ == PrefixSpace::always ||
                         (prefix_space_ == PrefixSpace::first && segment.begin == 0)) &&
                        text[segment.begin] != ' ';
    const sentencepiece::SentencePieceProcessor& processor =
        prefix ? *processor_ : without_prefix_space();
    const std::string_view plain = text.substr(segment.begin, segment.end - segment.begin);
    const sentencepiece::ImmutableSentencePieceText pieces =
        processor.EncodeAsImmutableProto(plain);
    for (size_t i = 0; i < pieces.pieces_size(); ++i) {
      const auto piece = pieces.pieces(static_cast<int>(i));
      out.push(static_cast<int32_t>(piece.id()), segment.begin + piece.begin(),
               segment.begin + piece.end());
    }
  }
}

}  // namespace frugal
