// The Tokenizer facade: which kind a file is, where a directory keeps it, and the checks
// every kind shares.
#include "data/tokenizer.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "core/regular_file.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece_model.h"

namespace frugal {

namespace fs = std::filesystem;

TokenizerKind tokenizer_kind_of(const std::string& path) {
  require_regular_file(path, "tokenizer");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("tokenizer '", path, "' cannot be read");
  // A SentencePiece model is a protobuf: it starts with a field tag, never with '{'.
  char c = 0;
  while (in.get(c) && (c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
  }
  return in && c == '{' ? TokenizerKind::byte_level_bpe : TokenizerKind::sentencepiece;
}

const char* tokenizer_file_name(TokenizerKind kind) {
  return kind == TokenizerKind::sentencepiece ? "tokenizer.model" : "tokenizer.json";
}

std::string find_tokenizer(const std::string& dir) {
  for (TokenizerKind kind : {TokenizerKind::sentencepiece, TokenizerKind::byte_level_bpe}) {
    const fs::path p = fs::path(dir) / tokenizer_file_name(kind);
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

std::string copy_tokenizer(const std::string& path, const std::string& dir) {
  const TokenizerKind kind = tokenizer_kind_of(path);
  std::vector<std::pair<fs::path, fs::path>> copies = {
      {path, fs::path(dir) / tokenizer_file_name(kind)}};
  const fs::path config = fs::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (kind == TokenizerKind::byte_level_bpe && fs::is_regular_file(config, ec))
    copies.emplace_back(config, fs::path(dir) / "tokenizer_config.json");
  for (const auto& [from, to] : copies) {
    if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) continue;
    fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
    if (ec) fail("cannot copy '", from.string(), "' to '", to.string(), "': ", ec.message());
  }
  // A tokenizer.model left from before would win over the new tokenizer.json in find_tokenizer.
  const fs::path stale = fs::path(dir) / tokenizer_file_name(TokenizerKind::sentencepiece);
  if (kind == TokenizerKind::byte_level_bpe && fs::exists(stale, ec)) {
    log_warn("removing '", stale.string(), "': ", copies.front().second.string(),
             " is this directory's tokenizer now");
    fs::remove(stale, ec);
    if (ec) fail("cannot remove '", stale.string(), "': ", ec.message());
  }
  return copies.front().second.string();
}

Tokenizer::Tokenizer(const std::string& path) : path_(path), kind_(tokenizer_kind_of(path)) {
  if (kind_ == TokenizerKind::sentencepiece)
    model_ = std::make_unique<SentencePieceModel>(path);
  else
    model_ = std::make_unique<HfTokenizer>(path);
  if (model_->vocab_size() <= 0) fail("tokenizer '", path, "' has no tokens");
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text) const { return model_->encode(text); }

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int32_t n = vocab_size();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= n)
      fail("tokenizer '", path_, "': id ", ids[i], " at position ", i,
           " is outside the vocabulary [0, ", n, ")");
  return model_->decode(ids);
}

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("tokenizer '", path_, "': id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
  return model_->piece(id);
}

bool Tokenizer::prepends_bos() const { return model_->prepends_bos(); }
int32_t Tokenizer::vocab_size() const { return model_->vocab_size(); }
int32_t Tokenizer::bos_id() const { return model_->bos_id(); }
int32_t Tokenizer::eos_id() const { return model_->eos_id(); }
int32_t Tokenizer::pad_id() const { return model_->pad_id(); }
int32_t Tokenizer::unk_id() const { return model_->unk_id(); }

}  // namespace frugal
