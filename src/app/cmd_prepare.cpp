// `frugal prepare`: corpus -> tokenizer (.model or .json, with its chat template), train.tok,
// val.tok and prepare.json in one directory, ready for `frugal train`.
#include <boost/program_options.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/regular_file.h"
#include "data/chat_template.h"
#include "data/corpus.h"
#include "data/document_tokens.h"
#include "data/shuffle.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "train/chat_template_trial.h"

namespace frugal {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

// What prepare does with a document longer than --max-tokens.
enum class Overlong { truncate, split, drop };
std::span<const EnumName<Overlong>> enum_names(Overlong) {
  static constexpr EnumName<Overlong> names[] = {
      {Overlong::truncate, "truncate"}, {Overlong::split, "split"}, {Overlong::drop, "drop"}};
  return names;
}

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  int32_t vocab_size = 2048;
  double val_fraction = 0.05;
  uint64_t seed = 1234;
  std::string tokenizer_path;
  std::string chat_template_path;
  std::string format = "auto";
  std::string model_type = "bpe";
  int64_t max_tokens = 0;
  std::string overlong = "truncate";
  bool skip_bad_records = false;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(digits);
  out << value;
  return out.str();
}

// What one split's encoding came to, for the log and prepare.json.
struct SplitReport {
  TokenFileHeader header;
  int64_t tokens_by_role[kTokenRoles] = {};
  int64_t without_reply = 0;  // instruction/chat documents with no reply token
  int64_t truncated = 0;      // documents cut to --max-tokens
  int64_t split_pieces = 0;   // pieces that --overlong split made beyond the first
  int64_t dropped_long = 0;   // documents longer than --max-tokens, dropped
  int64_t dropped_bad = 0;    // documents the encoder refused, with --skip-bad-records
  std::vector<std::string> bad;
  int64_t longest = 0;  // tokens, before any cut
};

// `doc` cut to `max_tokens` as `overlong` says: the pieces to write (none: dropped).
std::vector<TokenizedDocument> fit(TokenizedDocument doc, int64_t max_tokens, Overlong overlong,
                                   SplitReport& report) {
  const auto n = static_cast<int64_t>(doc.ids.size());
  if (max_tokens <= 0 || n <= max_tokens) return {std::move(doc)};
  if (overlong == Overlong::drop) {
    ++report.dropped_long;
    return {};
  }
  std::vector<TokenizedDocument> pieces;
  for (int64_t begin = 0; begin < n; begin += max_tokens) {
    const int64_t end = std::min(n, begin + max_tokens);
    TokenizedDocument piece;
    piece.content = doc.content;
    piece.ids.assign(doc.ids.begin() + begin, doc.ids.begin() + end);
    if (!doc.roles.empty()) piece.roles.assign(doc.roles.begin() + begin, doc.roles.begin() + end);
    pieces.push_back(std::move(piece));
    if (overlong == Overlong::truncate) break;
  }
  if (overlong == Overlong::truncate)
    ++report.truncated;
  else
    report.split_pieces += int64_t(pieces.size()) - 1;
  return pieces;
}

// Encodes the documents (OpenMP: the tokenizers and the template are thread-safe) and writes
// them, in order, as one token file.
SplitReport write_split(const DocumentEncoder& encoder, const Tokenizer& tokenizer,
                        const std::vector<CorpusDocument>& docs, const std::string& path,
                        const PrepareOptions& opt, Overlong overlong, Progress& progress) {
  SplitReport report;
  std::vector<std::optional<TokenizedDocument>> encoded(docs.size());
  std::string error;
  std::mutex bad_mutex;
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t i = 0; i < static_cast<int64_t>(docs.size()); ++i) {
    const CorpusDocument& doc = docs[static_cast<size_t>(i)];
    try {
      encoded[static_cast<size_t>(i)] =
          encoder.encode(doc, [&progress](int64_t bytes) { progress.advance(bytes); });
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(bad_mutex);
      if (!opt.skip_bad_records) {
        if (error.empty()) error = e.what();
      } else {
        ++report.dropped_bad;
        if (report.bad.size() < kMaxBadRecordMessages) report.bad.push_back(e.what());
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(bad_mutex);
      if (error.empty()) error = doc.where + ": " + e.what();
    }
  }
  if (!error.empty()) throw Error(error);
  TokenFileWriter writer(path, static_cast<uint32_t>(tokenizer.vocab_size()), tokenizer.bos_id(),
                         tokenizer.eos_id());
  for (std::optional<TokenizedDocument>& doc : encoded) {
    if (!doc) continue;
    report.longest = std::max(report.longest, int64_t(doc->ids.size()));
    for (TokenizedDocument& piece : fit(std::move(*doc), opt.max_tokens, overlong, report)) {
      bool reply = piece.roles.empty();
      for (TokenRole role : piece.roles) {
        ++report.tokens_by_role[int(role)];
        reply = reply || role != TokenRole::prompt;
      }
      if (!reply) ++report.without_reply;
      writer.add_document(piece);
    }
  }
  report.header = writer.finish();
  return report;
}

nlohmann::ordered_json report_json(const SplitReport& r) {
  nlohmann::ordered_json j = {{"documents", r.header.num_documents},
                              {"tokens", r.header.num_tokens},
                              {"longest_document_tokens", r.longest}};
  if (r.header.has_roles) {
    j["tokens_by_role"] = {{"prompt", r.tokens_by_role[0]},
                           {"reply", r.tokens_by_role[1]},
                           {"last_reply", r.tokens_by_role[2]}};
    j["documents_without_reply"] = r.without_reply;
  }
  j["truncated"] = r.truncated;
  j["split_pieces"] = r.split_pieces;
  j["dropped_long"] = r.dropped_long;
  j["dropped_bad"] = r.dropped_bad;
  return j;
}

void log_split(const char* name, const SplitReport& r, const PrepareOptions& opt) {
  if (r.header.has_roles) {
    const int64_t replies = r.tokens_by_role[1] + r.tokens_by_role[2];
    log_info("prepare: ", name, ": ", replies, " of ", r.header.num_tokens,
             " tokens are replies (trained by default), ", r.tokens_by_role[2],
             " of them last replies");
    if (r.without_reply > 0)
      log_warn("prepare: ", name, ": ", r.without_reply, " of ", r.header.num_documents,
               " documents have no reply to train on (no assistant turn, or cut off by ",
               "--max-tokens)");
  }
  if (opt.max_tokens > 0 && (r.truncated || r.split_pieces || r.dropped_long))
    log_warn("prepare: ", name, ": documents longer than --max-tokens ", opt.max_tokens, ": ",
             r.truncated, " truncated, ", r.split_pieces, " extra pieces from splitting, ",
             r.dropped_long, " dropped (the longest had ", r.longest, " tokens)");
  if (r.dropped_bad > 0) {
    log_warn("prepare: ", name, ": skipped ", r.dropped_bad,
             " documents that could not be encoded (--skip-bad-records); the first:");
    for (const std::string& m : r.bad) log_warn("  ", m);
  }
}

}  // namespace

int cmd_prepare(const std::vector<std::string>& args) {
  PrepareOptions opt;
  po::options_description named("options");
  // clang-format off
  named.add_options()
      ("help,h", "print this help and exit")
      ("out,o", po::value<std::string>(&opt.out_dir)->value_name("DIR"),
       "output directory (required); created if missing")
      ("vocab-size", po::value<int32_t>(&opt.vocab_size)->default_value(opt.vocab_size)
           ->value_name("N"),
       "tokenizer vocabulary size when training one")
      ("val-fraction", po::value<double>(&opt.val_fraction)->default_value(opt.val_fraction, "0.05")
           ->value_name("F"),
       "fraction of documents held out for validation, in [0, 1)")
      ("seed", po::value<uint64_t>(&opt.seed)->default_value(opt.seed)->value_name("N"),
       "seed of the train/val split and of tokenizer training")
      ("tokenizer", po::value<std::string>(&opt.tokenizer_path)->value_name("PATH"),
       "use this tokenizer instead of training one: a tokenizer.model (SentencePiece), a "
       "tokenizer.json (byte-level BPE), or a Hugging Face model directory holding one; it is "
       "copied to DIR with tokenizer_config.json, chat_template.jinja and generation_config.json "
       "where they are beside it")
      ("chat-template", po::value<std::string>(&opt.chat_template_path)->value_name("FILE"),
       "a Jinja chat template to render conversations with, instead of the tokenizer's own "
       "(written to DIR/chat_template.jinja)")
      ("format", po::value<std::string>(&opt.format)->default_value(opt.format)
           ->value_name("F"),
       "input format: auto (per file: jsonl for *.jsonl/*.json, fortune when a file has a '%' "
       "line, else text), text (a file is a document), fortune (documents between '%' lines), "
       "jsonl (JSON records, their format told by a file's first record), or records of one "
       "format: messages, sharegpt, alpaca, completion")
      ("model-type", po::value<std::string>(&opt.model_type)->default_value(opt.model_type)
           ->value_name("T"),
       "tokenizer model when training one: bpe or unigram")
      ("max-tokens", po::value<int64_t>(&opt.max_tokens)->default_value(opt.max_tokens)
           ->value_name("N"),
       "documents longer than N tokens are cut as --overlong says (0: no limit)")
      ("overlong", po::value<std::string>(&opt.overlong)->default_value(opt.overlong)
           ->value_name("HOW"),
       "with --max-tokens: truncate (keep the first N tokens), split (pieces of N tokens, each "
       "a document), drop (leave the document out); each counted in prepare.json")
      ("skip-bad-records", po::bool_switch(&opt.skip_bad_records),
       "skip and count records that are not valid (bad JSON, unknown role, empty assistant "
       "turn, a template that raises) instead of stopping at the first");
  // clang-format on
  po::options_description hidden;
  hidden.add_options()("input", po::value<std::vector<std::string>>(&opt.inputs),
                       "input files or directories");
  po::options_description all;
  all.add(named).add(hidden);
  po::positional_options_description positional;
  positional.add("input", -1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    fail("prepare: ", program_options_message(e), " (see 'frugal prepare --help')");
  }
  if (vm.count("help")) {
    std::cout
        << "usage: frugal prepare --out DIR [options] INPUT...\n\n"
           "Reads a corpus (text files, fortune files, JSON records, or directories of them),\n"
           "trains a SentencePiece tokenizer on the training documents (or takes --tokenizer),\n"
           "and writes the tokenizer, DIR/train.tok, DIR/val.tok and DIR/prepare.json.\n"
           "Documents are split into train and val by a seeded shuffle.\n\n"
           "JSON records (one per line, or a JSON array) are text {\"text\"}, instruction data\n"
           "(Alpaca {\"instruction\", \"input\", \"output\"}, {\"prompt\", \"completion\"}) or "
           "chat\n"
           "data ({\"messages\": [{\"role\", \"content\"}...]}, ShareGPT {\"conversations\":\n"
           "[{\"from\", \"value\"}...]}). Text is stored as bos, ids, eos; an instruction as\n"
           "bos, prompt, completion, eos; a conversation as the model's chat template renders\n"
           "it. Each token of instruction and chat data records whether it is a reply (the\n"
           "completion, an assistant turn): `frugal train` learns from the replies alone by\n"
           "default (data.train_on).\n\n"
        << named << "\n";
    return 0;
  }

  if (opt.out_dir.empty()) fail("prepare: --out DIR is required (see 'frugal prepare --help')");
  if (opt.inputs.empty())
    fail("prepare: no input given: name one or more files or directories after the options");
  if (!(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0))
    fail("prepare: --val-fraction ", opt.val_fraction, " is not in [0, 1)");
  const bool train_new = opt.tokenizer_path.empty();
  if (train_new && opt.vocab_size < kMinTokenizerVocab)
    fail("prepare: --vocab-size ", opt.vocab_size, " is too small: byte fallback alone takes ",
         "259 ids; use at least ", kMinTokenizerVocab);
  if (!train_new && !vm["vocab-size"].defaulted())
    log_warn("prepare: --vocab-size is ignored with --tokenizer (the model sets the vocab)");
  if (opt.model_type != "bpe" && opt.model_type != "unigram")
    fail("prepare: --model-type '", opt.model_type, "' is not one of: bpe, unigram");
  if (opt.max_tokens < 0) fail("prepare: --max-tokens ", opt.max_tokens, " must be >= 0");
  const std::optional<Overlong> overlong = enum_from_name<Overlong>(opt.overlong);
  if (!overlong)
    fail("prepare: --overlong '", opt.overlong, "' is not one of: ", enum_name_list<Overlong>());
  CorpusOptions corpus_options;
  corpus_options.skip_bad_records = opt.skip_bad_records;
  if (const auto format = enum_from_name<CorpusFormat>(opt.format))
    corpus_options.format = *format;
  else
    fail("prepare: --format '", opt.format, "' is not one of: ", enum_name_list<CorpusFormat>());
  // A model directory stands for its tokenizer.
  if (std::error_code ec; !train_new && fs::is_directory(opt.tokenizer_path, ec)) {
    const std::string found = find_tokenizer(opt.tokenizer_path);
    if (found.empty())
      fail("prepare: --tokenizer '", opt.tokenizer_path,
           "' is a directory without tokenizer.model or tokenizer.json");
    opt.tokenizer_path = found;
  }
  if (!opt.chat_template_path.empty())
    require_regular_file(opt.chat_template_path, "prepare: --chat-template");
  const auto start = std::chrono::steady_clock::now();

  // 1. The corpus.
  for (const std::string& input : opt.inputs)
    if (std::error_code ec; !fs::exists(input, ec))
      fail("prepare: input '", input, "' does not exist");
  Corpus corpus = read_corpus(opt.inputs, corpus_options);
  const uint32_t content = corpus.content();
  log_info("prepare: read ", corpus.stats.documents, " ", content_names(content), " documents (",
           fixed(double(corpus.stats.bytes) / 1e6, 2), " MB) from ", corpus.stats.files,
           " files in ", fixed(seconds_since(start), 2), " s");
  if (corpus.stats.skipped_files > 0)
    log_info("prepare: skipped ", corpus.stats.skipped_files,
             " files (fortune *.dat indexes, binary files, second names of a file)");
  if (corpus.stats.skipped_invalid_utf8 > 0)
    log_warn("prepare: skipped ", corpus.stats.skipped_invalid_utf8,
             " documents (or JSON lines) that are not valid UTF-8");
  if (corpus.stats.skipped_bad_records > 0) {
    log_warn("prepare: skipped ", corpus.stats.skipped_bad_records,
             " bad records (--skip-bad-records); the first:");
    for (const std::string& m : corpus.bad_records) log_warn("  ", m);
  }
  if (corpus.documents.empty())
    fail("prepare: the corpus is empty: no documents with text in ", opt.inputs.size(),
         " input(s), ", corpus.stats.files, " file(s) read");
  const bool has_text = content & content_bit(DocumentContent::text);
  const bool has_chat = content & content_bit(DocumentContent::chat);
  if (has_text && content != content_bit(DocumentContent::text)) {
    const auto first_of = [&](bool text) {
      for (const CorpusDocument& d : corpus.documents)
        if ((d.content == DocumentContent::text) == text) return d.where;
      return std::string();
    };
    fail("prepare: the corpus mixes plain text (", first_of(true), ") with instruction or chat ",
         "data (", first_of(false), "): text has no prompt to leave out of the loss; prepare ",
         "them into separate directories");
  }

  // 2. The train/val split: a seeded shuffle picks the validation documents; both splits
  // keep the corpus order.
  const auto n_docs = static_cast<int64_t>(corpus.documents.size());
  int64_t n_val = 0;
  if (opt.val_fraction > 0) {
    n_val = std::max<int64_t>(1, std::llround(opt.val_fraction * double(n_docs)));
    n_val = std::min(n_val, n_docs - 1);
    if (n_val == 0)
      log_warn("prepare: one document only: nothing held out for validation (val.tok empty)");
  }
  std::vector<int64_t> order = seeded_permutation(n_docs, opt.seed);
  std::vector<bool> is_val(static_cast<size_t>(n_docs), false);
  for (int64_t i = 0; i < n_val; ++i)
    is_val[static_cast<size_t>(order[static_cast<size_t>(i)])] = true;
  std::vector<CorpusDocument> train_docs, val_docs;
  train_docs.reserve(static_cast<size_t>(n_docs - n_val));
  val_docs.reserve(static_cast<size_t>(n_val));
  for (int64_t i = 0; i < n_docs; ++i)
    (is_val[static_cast<size_t>(i)] ? val_docs : train_docs)
        .push_back(std::move(corpus.documents[static_cast<size_t>(i)]));
  corpus.documents.clear();

  // 3. The tokenizer: trained on the training documents only, so validation stays unseen.
  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) fail("prepare: cannot create output directory '", opt.out_dir, "': ", ec.message());
  std::string model_path = (fs::path(opt.out_dir) / "tokenizer.model").string();
  double tokenizer_seconds = 0;
  if (train_new) {
    // Files of a tokenizer prepared here before would be read as the new one's.
    for (const std::string& name : tokenizer_companion_files())
      if (name != "chat_template.jinja" || opt.chat_template_path.empty())
        fs::remove(fs::path(opt.out_dir) / name, ec);
    const auto t0 = std::chrono::steady_clock::now();
    TokenizerTrainOptions train_options;
    train_options.vocab_size = opt.vocab_size;
    train_options.model_type = opt.model_type;
    train_options.seed = static_cast<uint32_t>(opt.seed);
    log_info("prepare: training a ", opt.model_type, " tokenizer, vocab ", opt.vocab_size, ", on ",
             train_docs.size(), " documents");
    std::vector<std::string> texts;
    texts.reserve(train_docs.size());
    for (const CorpusDocument& d : train_docs) texts.push_back(d.plain_text());
    train_tokenizer(texts, model_path, train_options);
    tokenizer_seconds = seconds_since(t0);
    log_info("prepare: tokenizer trained in ", fixed(tokenizer_seconds, 2), " s -> ", model_path);
  } else {
    Tokenizer given(opt.tokenizer_path);  // validates before copying
    model_path = copy_tokenizer(opt.tokenizer_path, opt.out_dir);
    log_info("prepare: using ", enum_name(given.kind()), " tokenizer ", opt.tokenizer_path,
             " (vocab ", given.vocab_size(), ")");
  }
  if (!opt.chat_template_path.empty()) {
    const fs::path copy = fs::path(opt.out_dir) / "chat_template.jinja";
    if (!(fs::exists(copy, ec) && fs::equivalent(opt.chat_template_path, copy, ec))) {
      fs::copy_file(opt.chat_template_path, copy, fs::copy_options::overwrite_existing, ec);
      if (ec)
        fail("prepare: cannot copy --chat-template '", opt.chat_template_path, "' to '",
             copy.string(), "': ", ec.message());
    }
  }
  Tokenizer tokenizer(model_path);
  // Documents end with eos; bos, where the tokenizer has one, starts them.
  if (tokenizer.eos_id() < 0)
    fail("prepare: tokenizer '", model_path,
         "' has no eos piece; token files end every document "
         "with one",
         tokenizer.kind() == TokenizerKind::byte_level_bpe
             ? " (a tokenizer.json takes it from eos_token of the tokenizer_config.json beside it)"
             : "");
  if (tokenizer.bos_id() < 0)
    log_info("prepare: the tokenizer has no bos: each text document is stored as ids..., eos");
  std::optional<ChatTemplate> chat_template;
  if (has_chat) {
    chat_template = find_chat_template(
        model_path, opt.chat_template_path,
        tokenizer.bos_id() >= 0 ? tokenizer.piece(tokenizer.bos_id()) : std::string(),
        tokenizer.piece(tokenizer.eos_id()));
    if (!chat_template)
      fail("prepare: the corpus holds conversations, and tokenizer '", model_path,
           "' has no chat template to render them with (none in a tokenizer_config.json or "
           "chat_template.jinja beside it): give --chat-template FILE");
    std::vector<Conversation> samples;
    for (const CorpusDocument& d : train_docs)
      if (d.content == DocumentContent::chat && samples.size() < 8) samples.push_back(d.conversation);
    try_chat_template(*chat_template, samples);
    log_info("prepare: rendering conversations with chat template ", chat_template->source());
  }

  // 4. The token files.
  const auto t_encode = std::chrono::steady_clock::now();
  const std::string train_path = (fs::path(opt.out_dir) / "train.tok").string();
  const std::string val_path = (fs::path(opt.out_dir) / "val.tok").string();
  int64_t text_bytes = 0;
  for (const auto* docs : {&train_docs, &val_docs})
    for (const CorpusDocument& doc : *docs) text_bytes += int64_t(doc.plain_bytes());
  Progress progress("prepare: encoded", text_bytes,
                    [](int64_t bytes) { return fixed(double(bytes) / 1e6, 2) + " MB"; });
  const DocumentEncoder encoder(tokenizer, chat_template ? &*chat_template : nullptr);
  const SplitReport train =
      write_split(encoder, tokenizer, train_docs, train_path, opt, *overlong, progress);
  const SplitReport val =
      write_split(encoder, tokenizer, val_docs, val_path, opt, *overlong, progress);
  log_info("prepare: wrote ", train.header.num_tokens, " train tokens (",
           train.header.num_documents, " documents) and ", val.header.num_tokens, " val tokens (",
           val.header.num_documents, " documents) in ", fixed(seconds_since(t_encode), 2), " s");
  log_split("train", train, opt);
  log_split("val", val, opt);
  if (train.header.num_documents == 0)
    fail("prepare: no training document is left (", train.dropped_long, " longer than ",
         "--max-tokens dropped, ", train.dropped_bad, " that could not be encoded skipped)");
  if (train.header.has_roles && train.tokens_by_role[1] + train.tokens_by_role[2] == 0)
    fail("prepare: '", train_path, "' has no reply to train on: no document has a completion or ",
         "an assistant turn", opt.max_tokens > 0 ? " within --max-tokens" : "");

  // 5. The record of what was done.
  nlohmann::ordered_json record = {
      {"sources", opt.inputs},
      {"files", corpus.files},
      {"format", opt.format},
      {"content", content_names(content)},
      {"seed", opt.seed},
      {"val_fraction", opt.val_fraction},
      {"documents",
       {{"total", n_docs},
        {"train", train.header.num_documents},
        {"val", val.header.num_documents},
        {"skipped_empty", corpus.stats.skipped_empty},
        {"skipped_invalid_utf8", corpus.stats.skipped_invalid_utf8},
        {"skipped_bad_records", corpus.stats.skipped_bad_records},
        {"skipped_files", corpus.stats.skipped_files}}},
      {"bytes", corpus.stats.bytes},
      {"tokens", {{"train", train.header.num_tokens}, {"val", val.header.num_tokens}}},
      {"max_tokens", opt.max_tokens},
      {"overlong", opt.overlong},
      {"train", report_json(train)},
      {"val", report_json(val)},
      {"vocab_size", tokenizer.vocab_size()},
      {"bos_id", tokenizer.bos_id()},
      {"eos_id", tokenizer.eos_id()},
      {"pad_id", tokenizer.pad_id()},
      {"unk_id", tokenizer.unk_id()},
      {"document_layout", has_chat                  ? "as the chat template renders it"
                          : !has_text               ? "bos prompt completion eos"
                          : tokenizer.bos_id() >= 0 ? "bos ids... eos"
                                                    : "ids... eos"},
      {"chat_template", chat_template ? chat_template->source() : std::string()},
      {"tokenizer",
       {{"trained", train_new},
        {"source", train_new ? std::string("trained") : opt.tokenizer_path},
        {"model_type", train_new ? opt.model_type : std::string("given")},
        {"seconds", tokenizer_seconds}}},
  };
  const std::string json_path = (fs::path(opt.out_dir) / "prepare.json").string();
  std::ofstream json_out(json_path);
  json_out << record.dump(2) << "\n";
  json_out.close();
  if (!json_out) fail("prepare: writing '", json_path, "' failed");
  log_info("prepare: done in ", fixed(seconds_since(start), 2), " s -> ", opt.out_dir);
  return 0;
}

}  // namespace frugal
