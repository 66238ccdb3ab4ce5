// SentencePiece behind TokenizerModel, and deterministic SentencePiece tokenizer training.
#include "data/sentencepiece_model.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "core/duration.h"
#include "core/error.h"
#include "core/log.h"
#include "core/regular_file.h"
#include "data/shuffle.h"
#include "data/tokenizer.h"

namespace frugal {

namespace fs = std::filesystem;

SentencePieceModel::SentencePieceModel(const std::string& model_path)
    : path_(model_path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  require_regular_file(model_path, "tokenizer model");  // SentencePiece opens it itself
  auto status = processor_->Load(model_path);
  if (!status.ok())
    fail("tokenizer model '", model_path, "' is not a valid SentencePiece model (",
         status.ToString(), ")");
  if (processor_->GetPieceSize() <= 0) fail("tokenizer model '", model_path, "' has no pieces");
  read_special_tokens();
}

SentencePieceModel::~SentencePieceModel() = default;

std::vector<int32_t> SentencePieceModel::encode(std::string_view text) const {
  std::vector<int> ids;
  auto status = processor_->Encode(text, &ids);
  if (!status.ok()) fail("tokenizer '", path_, "': encoding failed: ", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceModel::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  auto status = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok()) fail("tokenizer '", path_, "': decoding failed: ", status.ToString());
  return text;
}

std::string SentencePieceModel::piece(int32_t id) const { return processor_->IdToPiece(id); }

int32_t SentencePieceModel::vocab_size() const { return processor_->GetPieceSize(); }
int32_t SentencePieceModel::bos_id() const { return processor_->bos_id(); }
int32_t SentencePieceModel::eos_id() const { return processor_->eos_id(); }
int32_t SentencePieceModel::pad_id() const { return processor_->pad_id(); }
int32_t SentencePieceModel::unk_id() const { return processor_->unk_id(); }

namespace {

// A training sentence: bytes [begin, end) of document `document`.
struct SentenceSpan {
  size_t document, begin, end;
};

// Cuts a document into training sentences of at most max_bytes, at line ends where it can
// (after the '\n', so newlines are learnt) and otherwise at a UTF-8 character boundary.
// SentencePiece skips longer sentences, which would silently drop whole plain-text books.
// A line end is looked for within the sentence only: a search back to the document's start
// made one 100 MB line quadratic (an hour of scanning).
void append_sentences(const std::string& doc, size_t document, size_t max_bytes,
                      std::vector<SentenceSpan>& out) {
  size_t begin = 0;
  while (begin < doc.size()) {
    size_t end = std::min(doc.size(), begin + max_bytes);
    if (end < doc.size()) {
      const size_t newline = std::string_view(doc).substr(begin, end - begin).rfind('\n');
      if (newline != std::string_view::npos) {
        end = begin + newline + 1;
      } else {
        // No line end in reach: back up to the start of a UTF-8 character.
        while (end > begin + 1 && (static_cast<unsigned char>(doc[end]) & 0xC0) == 0x80) --end;
      }
    }
    out.push_back({document, begin, end});
    begin = end;
  }
}

class VectorSentenceIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorSentenceIterator(const std::vector<std::string>& sentences)
      : sentences_(sentences) {}
  bool done() const override { return index_ >= sentences_.size(); }
  void Next() override { ++index_; }
  const std::string& value() const override { return sentences_[index_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& sentences_;
  size_t index_ = 0;
};

// SentencePiece says nothing while it trains: a line every interval_s tells that it is at
// work, and for how long (its time grows with the text, up to max_training_bytes).
class TrainingHeartbeat {
 public:
  TrainingHeartbeat(std::string what, double interval_s)
      : what_(std::move(what)), thread_([this, interval_s] { run(interval_s); }) {}
  ~TrainingHeartbeat() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

 private:
  void run(double interval_s) {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    while (
        !wake_.wait_for(lock, std::chrono::duration<double>(interval_s), [this] { return done_; }))
      log_info(what_, ": ",
               format_duration(
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()),
               " so far");
  }

  std::string what_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace

TokenizerTrainingText tokenizer_training_text(const std::vector<std::string>& documents,
                                              const TokenizerTrainOptions& options) {
  if (options.max_sentence_bytes < 16)
    fail("tokenizer max sentence bytes ", options.max_sentence_bytes, " is below 16");
  if (options.max_training_bytes != 0 && options.max_training_bytes < options.max_sentence_bytes)
    fail("tokenizer max training bytes ", options.max_training_bytes,
         " is below the max sentence bytes ", options.max_sentence_bytes);
  std::vector<SentenceSpan> spans;
  for (size_t d = 0; d < documents.size(); ++d)
    append_sentences(documents[d], d, static_cast<size_t>(options.max_sentence_bytes), spans);
  TokenizerTrainingText text;
  text.corpus_sentences = static_cast<int64_t>(spans.size());
  for (const SentenceSpan& s : spans) text.corpus_bytes += static_cast<int64_t>(s.end - s.begin);

  std::vector<size_t> chosen;  // indices into spans, in corpus order
  if (options.max_training_bytes == 0 || text.corpus_bytes <= options.max_training_bytes) {
    chosen.resize(spans.size());
    for (size_t i = 0; i < spans.size(); ++i) chosen[i] = i;
  } else {
    // Whole sentences in a seeded order while they fit; their own stream of the seed, apart
    // from prepare's train/val split.
    constexpr uint64_t kSampleStream = 0x746f6b656e697a65;  // "tokenize"
    int64_t bytes = 0;
    for (int64_t i : seeded_permutation(text.corpus_sentences, options.seed, kSampleStream)) {
      const auto length = static_cast<int64_t>(spans[size_t(i)].end - spans[size_t(i)].begin);
      if (bytes + length > options.max_training_bytes) continue;
      bytes += length;
      chosen.push_back(size_t(i));
    }
    std::sort(chosen.begin(), chosen.end());
  }
  text.sentences.reserve(chosen.size());
  for (size_t i : chosen) {
    const SentenceSpan& s = spans[i];
    text.sentences.push_back(documents[s.document].substr(s.begin, s.end - s.begin));
    text.bytes += static_cast<int64_t>(s.end - s.begin);
  }
  return text;
}

void train_tokenizer(const std::vector<std::string>& documents, const std::string& model_path,
                     const TokenizerTrainOptions& options) {
  if (options.vocab_size < kMinTokenizerVocab)
    fail("tokenizer vocab size ", options.vocab_size, " is too small: byte fallback alone takes ",
         "259 ids (256 bytes, unk, bos, eos); use at least ", kMinTokenizerVocab);
  if (options.model_type != "bpe" && options.model_type != "unigram")
    fail("tokenizer model type '", options.model_type, "' is not one of: bpe, unigram");

  const TokenizerTrainingText text = tokenizer_training_text(documents, options);
  const std::vector<std::string>& sentences = text.sentences;
  if (sentences.empty()) fail("cannot train a tokenizer: the corpus holds no text");
  if (text.bytes < text.corpus_bytes)
    log_info("tokenizer training: the corpus holds ", format_bytes(size_t(text.corpus_bytes)),
             " in ", text.corpus_sentences, " sentences, more than the ",
             format_bytes(size_t(options.max_training_bytes)), " SentencePiece trains on: a ",
             "sample of ", sentences.size(), " sentences (", format_bytes(size_t(text.bytes)),
             ", seed ", options.seed, ")");

  // Llama's settings, spelled out: identity normalization and kept whitespace make
  // decode(encode(text)) == text for any UTF-8 text.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", options.model_type},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"num_threads", "1"},
      {"input_sentence_size", std::to_string(options.input_sentence_size)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(options.max_sentence_bytes)},
      // Pieces containing "\n" would make SentencePiece warn about its .vocab file, which we
      // do not write (an empty model_prefix and a serialized model instead).
      {"minloglevel", "2"},
  };
  // SentencePiece reserves seed 0xffffffff for "seed from std::random_device".
  sentencepiece::SetRandomGeneratorSeed(options.seed == 0xffffffffu ? 0x7fffffffu : options.seed);
  VectorSentenceIterator iterator(sentences);
  std::string model;
  sentencepiece::util::Status status;
  {
    const TrainingHeartbeat heartbeat("tokenizer training: SentencePiece (" + options.model_type +
                                          ") on " + format_bytes(size_t(text.bytes)),
                                      kTrainingHeartbeatSeconds);
    status = sentencepiece::SentencePieceTrainer::Train(args, &iterator, &model);
  }
  if (!status.ok())
    fail("training the tokenizer (", options.model_type, ", vocab size ", options.vocab_size, ", ",
         sentences.size(), " sentences) failed: ", status.ToString());

  // Write to a temporary name and rename, so a crash never leaves half a model behind.
  const std::string tmp_path = model_path + ".tmp";
  {
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write tokenizer model '", tmp_path, "'");
    out.write(model.data(), static_cast<std::streamsize>(model.size()));
    if (!out) fail("writing tokenizer model '", tmp_path, "' failed");
  }
  std::error_code ec;
  fs::rename(tmp_path, model_path, ec);
  if (ec) fail("cannot rename '", tmp_path, "' to '", model_path, "': ", ec.message());
}

void train_tokenizer_from_file(const std::string& text_path, const std::string& model_path,
                               const TokenizerTrainOptions& options) {
  require_regular_file(text_path, "tokenizer training text");
  std::ifstream in(text_path, std::ios::binary);
  if (!in) fail("cannot open tokenizer training text '", text_path, "'");
  std::ostringstream text;
  text << in.rdbuf();
  train_tokenizer({text.str()}, model_path, options);
}

}  // namespace frugal
