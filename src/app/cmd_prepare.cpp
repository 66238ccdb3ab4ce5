// `frugal prepare`: corpus -> tokenizer (.model or .json), train.tok, val.tok and prepare.json in
// one directory, ready for `frugal train`.
#include <boost/program_options.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/corpus.h"
#include "data/shuffle.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace frugal {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  int32_t vocab_size = 2048;
  double val_fraction = 0.05;
  uint64_t seed = 1234;
  std::string tokenizer_path;
  std::string format = "auto";
  std::string model_type = "bpe";
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

// Encodes the documents (OpenMP: SentencePiece encoding is thread-safe) and writes them, in
// order, as one token file. Returns the file's header.
TokenFileHeader write_split(const Tokenizer& tokenizer, const std::vector<std::string>& docs,
                            const std::string& path, Progress& progress) {
  std::vector<std::vector<int32_t>> ids(docs.size());
  std::string error;
#pragma omp parallel for schedule(dynamic, 64)
  for (int64_t i = 0; i < static_cast<int64_t>(docs.size()); ++i) {
    try {
      ids[static_cast<size_t>(i)] = tokenizer.encode(docs[static_cast<size_t>(i)]);
      progress.advance(int64_t(docs[static_cast<size_t>(i)].size()));
    } catch (const std::exception& e) {
#pragma omp critical
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) throw Error(error);
  TokenFileWriter writer(path, static_cast<uint32_t>(tokenizer.vocab_size()), tokenizer.bos_id(),
                         tokenizer.eos_id());
  for (const auto& doc : ids) writer.add_document(doc);
  return writer.finish();
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
       "use this tokenizer.model (SentencePiece) or tokenizer.json (byte-level BPE) instead "
       "of training one (copied to DIR)")
      ("format", po::value<std::string>(&opt.format)->default_value(opt.format)
           ->value_name("F"),
       "input format: auto, text (a file is a document), fortune (documents between '%' "
       "lines), jsonl (\"text\", or alpaca instruction/input/output); auto picks jsonl for "
       "*.jsonl/*.json, fortune when a file has a '%' line, else text")
      ("model-type", po::value<std::string>(&opt.model_type)->default_value(opt.model_type)
           ->value_name("T"),
       "tokenizer model when training one: bpe or unigram");
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
    std::cout << "usage: frugal prepare --out DIR [options] INPUT...\n\n"
                 "Reads a corpus (text files, fortune files, JSONL, or directories of them),\n"
                 "trains a SentencePiece tokenizer on the training documents (or takes\n"
                 "--tokenizer: a tokenizer.model or a tokenizer.json), and writes the tokenizer\n"
                 "(DIR/tokenizer.model or DIR/tokenizer.json), DIR/train.tok, DIR/val.tok\n"
                 "and DIR/prepare.json. Documents are split into train and val by a seeded\n"
                 "shuffle; each is stored as bos, ids..., eos (ids..., eos when the tokenizer has\n"
                 "no bos).\n\n"
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
  CorpusFormat format = CorpusFormat::auto_detect;
  try {
    format = corpus_format_from_name(opt.format);
  } catch (const Error& e) {
    fail("prepare: --format: ", e.what());
  }
  const auto start = std::chrono::steady_clock::now();

  // 1. The corpus.
  for (const std::string& input : opt.inputs)
    if (std::error_code ec; !fs::exists(input, ec))
      fail("prepare: input '", input, "' does not exist");
  Corpus corpus = read_corpus(opt.inputs, format);
  log_info("prepare: read ", corpus.stats.documents, " documents (",
           fixed(double(corpus.stats.bytes) / 1e6, 2), " MB) from ", corpus.stats.files,
           " files in ", fixed(seconds_since(start), 2), " s");
  if (corpus.stats.skipped_files > 0)
    log_info("prepare: skipped ", corpus.stats.skipped_files,
             " files (fortune *.dat indexes, binary files, second names of a file)");
  if (corpus.stats.skipped_invalid_utf8 > 0)
    log_warn("prepare: skipped ", corpus.stats.skipped_invalid_utf8,
             " documents that are not valid UTF-8");
  if (corpus.documents.empty())
    fail("prepare: the corpus is empty: no documents with text in ", opt.inputs.size(),
         " input(s), ", corpus.stats.files, " file(s) read");

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
  std::vector<std::string> train_docs, val_docs;
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
    const auto t0 = std::chrono::steady_clock::now();
    TokenizerTrainOptions train_options;
    train_options.vocab_size = opt.vocab_size;
    train_options.model_type = opt.model_type;
    train_options.seed = static_cast<uint32_t>(opt.seed);
    log_info("prepare: training a ", opt.model_type, " tokenizer, vocab ", opt.vocab_size, ", on ",
             train_docs.size(), " documents");
    train_tokenizer(train_docs, model_path, train_options);
    tokenizer_seconds = seconds_since(t0);
    log_info("prepare: tokenizer trained in ", fixed(tokenizer_seconds, 2), " s -> ", model_path);
  } else {
    Tokenizer given(opt.tokenizer_path);  // validates before copying
    model_path = copy_tokenizer(opt.tokenizer_path, opt.out_dir);
    log_info("prepare: using ", enum_name(given.kind()), " tokenizer ", opt.tokenizer_path,
             " (vocab ", given.vocab_size(), ")");
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
    log_info("prepare: the tokenizer has no bos: each document is stored as ids..., eos");

  // 4. The token files.
  const auto t_encode = std::chrono::steady_clock::now();
  const std::string train_path = (fs::path(opt.out_dir) / "train.tok").string();
  const std::string val_path = (fs::path(opt.out_dir) / "val.tok").string();
  int64_t text_bytes = 0;
  for (const auto* docs : {&train_docs, &val_docs})
    for (const std::string& doc : *docs) text_bytes += int64_t(doc.size());
  Progress progress("prepare: encoded", text_bytes,
                    [](int64_t bytes) { return fixed(double(bytes) / 1e6, 2) + " MB"; });
  const TokenFileHeader train = write_split(tokenizer, train_docs, train_path, progress);
  const TokenFileHeader val = write_split(tokenizer, val_docs, val_path, progress);
  log_info("prepare: wrote ", train.num_tokens, " train tokens (", train.num_documents,
           " documents) and ", val.num_tokens, " val tokens (", val.num_documents,
           " documents) in ", fixed(seconds_since(t_encode), 2), " s");

  // 5. The record of what was done.
  nlohmann::ordered_json record = {
      {"sources", opt.inputs},
      {"files", corpus.files},
      {"format", opt.format},
      {"seed", opt.seed},
      {"val_fraction", opt.val_fraction},
      {"documents",
       {{"total", n_docs},
        {"train", train.num_documents},
        {"val", val.num_documents},
        {"skipped_empty", corpus.stats.skipped_empty},
        {"skipped_invalid_utf8", corpus.stats.skipped_invalid_utf8},
        {"skipped_files", corpus.stats.skipped_files}}},
      {"bytes", corpus.stats.bytes},
      {"tokens", {{"train", train.num_tokens}, {"val", val.num_tokens}}},
      {"vocab_size", tokenizer.vocab_size()},
      {"bos_id", tokenizer.bos_id()},
      {"eos_id", tokenizer.eos_id()},
      {"pad_id", tokenizer.pad_id()},
      {"unk_id", tokenizer.unk_id()},
      {"document_layout", tokenizer.bos_id() >= 0 ? "bos ids... eos" : "ids... eos"},
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
