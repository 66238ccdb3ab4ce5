// `frugal eval`: the mean next-token cross-entropy of a model (a Hugging Face directory or a
// frugal checkpoint) on token ids or text, printed as one JSON line, on the CPU or GPUs, on
// one rank or several (weights sharded over them as in training, the sequences shared out).
// Also the whole-model loader that export uses.
#include <mpi.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/options.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "data/chat_template.h"
#include "data/corpus.h"
#include "data/document_tokens.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "data/train_on.h"
#include "model/hf_model.h"
#include "model/llama_model.h"
#include "quant/quantized_parameters.h"
#include "train/chat_template_trial.h"
#include "train/saved_model.h"
#include "train/sharded_model.h"

namespace frugal {

namespace po = boost::program_options;
namespace fs = std::filesystem;

InferenceModel load_inference_model(const std::string& command, const std::string& hf_dir,
                                    const std::string& ckpt_path) {
  if (hf_dir.empty() == ckpt_path.empty())
    fail(command, ": give exactly one of --hf-model DIR or --ckpt DIR (see 'frugal ", command,
         " --help')");
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks > 1)
    fail(command, " runs on one rank, not ", ranks, ": start it without mpirun (or with -n 1)");
  InferenceModel m;
  if (!hf_dir.empty()) {
    HfModelDir hf(hf_dir);
    m.config = hf.config();
    m.params = hf.load();
    m.source = "Hugging Face model '" + hf_dir + "'";
    m.tokenizer_path = hf.tokenizer_path();
    m.bos_id = hf.bos_token_id();
    m.eos_id = hf.eos_token_id();
  } else {
    SavedModel saved = load_saved_model(ckpt_path);
    m.config = saved.config;
    m.params = std::move(saved.params);
    m.source = "checkpoint '" + saved.step_dir + "'";
    m.tokenizer_path = saved.tokenizer_path;
  }
  // Ids the config does not give come from the tokenizer (frugal checkpoints have no
  // config.json), else frugal's and Llama's convention: bos 1, eos 2.
  if ((m.bos_id < 0 || m.eos_id < 0) && !m.tokenizer_path.empty()) {
    Tokenizer tokenizer(m.tokenizer_path);
    if (m.bos_id < 0) m.bos_id = tokenizer.bos_id();
    if (m.eos_id < 0) m.eos_id = tokenizer.eos_id();
  }
  if (m.bos_id < 0) m.bos_id = 1;
  if (m.eos_id < 0) m.eos_id = 2;
  return m;
}

namespace {

struct EvalOptions {
  std::string hf_dir, ckpt_path, tokens_path, text_path, token_file_path, data_path, tokenizer_path,
      logits_path, chat_template_path;
  std::string train_on = "auto";
  std::string packing = "auto";
  std::string format = "jsonl";
  std::string quant = "none";
  std::string device = "auto";
  std::string gpu_mem_limit = "0";
  int64_t seq_len = 0;
  int64_t max_sequences = 0;
  int64_t bucket_tokens = 0;
  bool timing = false;
};

// Sequences to evaluate: their ids and, where only some targets count (instruction and chat
// data), whether the target of each position (the next id) does.
struct EvalLines {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<bool>> counted;  // empty: every target counts
  std::string train_on;                    // the mode that chose them, when it did
  // Packed documents (--packing documents or pad): per sequence, where each position's document
  // begins and ends in it (empty: each sequence is one document).
  std::vector<std::vector<int32_t>> document_start, document_end;
  std::string packing;  // documents or pad, when they were packed
};

// `roles[j + 1]` decides target j of a sequence of n ids.
std::vector<bool> counted_targets_of(const TokenRole* roles, size_t n, TrainedRoles trained) {
  std::vector<bool> counted(n, false);
  for (size_t j = 0; j + 1 < n; ++j) counted[j] = (trained >> uint8_t(roles[j + 1])) & 1u;
  return counted;
}

// The windows of data.packing `packing` (documents or pad) of a token file, as training packs
// them (data/packing.h), in order; at most `max_sequences` (0: all).
EvalLines read_packed_token_file(const TokenFile& file, const std::string& path, int64_t seq_len,
                                 int64_t max_sequences, Packing packing, TrainedRoles trained) {
  const PackedWindows packed(file.document_starts(), seq_len, packing, LongDocuments::split, path);
  EvalIterator it(file.view(), seq_len, 1, 0, 1, max_sequences, {file.roles(), trained}, &packed);
  EvalLines lines;
  for (TokenBatch batch; it.next(batch);) {
    auto row = [&](const Tensor& t) {
      return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + seq_len);
    };
    lines.ids.push_back(row(batch.inputs));
    std::vector<bool> counted(static_cast<size_t>(seq_len));
    for (int64_t j = 0; j < seq_len; ++j)
      counted[size_t(j)] = batch.targets.data<int32_t>()[j] >= 0;
    lines.counted.push_back(std::move(counted));
    lines.document_start.push_back(row(batch.document_start));
    lines.document_end.push_back(row(batch.document_end));
  }
  return lines;
}

// Consecutive, non-overlapping sequences of seq_len ids from the start of a token file (the
// documents' bos and eos included, as training reads them), or with `packing` documents or pad
// its packed windows; at most `max_sequences` (0: all). The targets data.train_on's `mode` trains
// count, as in training.
EvalLines read_token_file(const std::string& path, int64_t seq_len, int64_t max_sequences,
                          TrainOn mode, Packing packing) {
  if (seq_len < 2) fail("eval: --token-file needs --seq-len N with N >= 2");
  TokenFile file(path);
  const TokenView view = file.view();
  const TrainedRoles trained = trained_roles(mode, file.header().content, path);
  const bool masked = file.roles() && trained != kEveryRole;
  const Packing resolved = resolved_packing(packing, file.header().content);
  if (resolved != Packing::windows) {
    EvalLines lines = read_packed_token_file(file, path, seq_len, max_sequences, resolved, trained);
    lines.packing = enum_name(resolved);
    if (masked) lines.train_on = enum_name(resolved_train_on(mode, file.header().content));
    return lines;
  }
  EvalLines lines;
  if (masked) lines.train_on = enum_name(resolved_train_on(mode, file.header().content));
  for (uint64_t begin = 0; begin + uint64_t(seq_len) <= view.size; begin += uint64_t(seq_len)) {
    if (max_sequences > 0 && int64_t(lines.ids.size()) == max_sequences) break;
    std::vector<int32_t> ids(static_cast<size_t>(seq_len));
    view.copy(begin, uint64_t(seq_len), ids.data());
    lines.ids.push_back(std::move(ids));
    if (masked)
      lines.counted.push_back(counted_targets_of(file.roles() + begin, size_t(seq_len), trained));
  }
  if (lines.ids.empty())
    fail("eval: '", path, "' holds ", view.size, " tokens, fewer than one sequence of ", seq_len);
  return lines;
}

// One sequence per document of a corpus file (instruction or chat records, or text), encoded as
// `frugal prepare` encodes it, with the targets `mode` trains.
EvalLines read_data_file(const std::string& path, CorpusFormat format, TrainOn mode,
                         const std::string& tokenizer_path, const std::string& template_path,
                         int32_t model_eos) {
  CorpusOptions options;
  options.format = format;
  const Corpus corpus = read_corpus({path}, options);
  if (corpus.documents.empty()) fail("eval: '", path, "' holds no document");
  const Tokenizer tokenizer(tokenizer_path);
  std::optional<ChatTemplate> chat;
  if (corpus.content() & content_bit(DocumentContent::chat)) {
    const int32_t bos = tokenizer.bos_id(), eos = tokenizer.eos_id();
    chat = find_chat_template(tokenizer_path, template_path,
                              bos >= 0 ? tokenizer.piece(bos) : std::string(),
                              tokenizer.piece(eos >= 0 ? eos : model_eos));
    if (!chat)
      fail("eval: '", path, "' holds conversations, and tokenizer '", tokenizer_path,
           "' has no chat template beside it: give --chat-template FILE");
    std::vector<Conversation> samples;
    for (const CorpusDocument& d : corpus.documents)
      if (d.content == DocumentContent::chat && samples.size() < 8)
        samples.push_back(d.conversation);
    try_chat_template(*chat, samples);
  }
  const TrainedRoles trained = trained_roles(mode, corpus.content(), path);
  const DocumentEncoder encoder(tokenizer, chat ? &*chat : nullptr);
  EvalLines lines;
  const bool masked =
      corpus.content() != content_bit(DocumentContent::text) && trained != kEveryRole;
  if (masked) lines.train_on = enum_name(resolved_train_on(mode, corpus.content()));
  for (const CorpusDocument& doc : corpus.documents) {
    TokenizedDocument encoded = encoder.encode(doc);
    if (masked)
      lines.counted.push_back(
          counted_targets_of(encoded.roles.data(), encoded.ids.size(), trained));
    lines.ids.push_back(std::move(encoded.ids));
  }
  return lines;
}

// Whitespace-separated ids, one sequence per line; blank lines are skipped.
std::vector<std::vector<int32_t>> read_token_lines(const std::string& path) {
  require_regular_file(path, "eval: token file");
  std::ifstream in(path);
  if (!in) fail("eval: cannot read token file '", path, "'");
  std::vector<std::vector<int32_t>> lines;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (number == 1 && line.rfind("FRUGTOK", 0) == 0)
      fail("eval: '", path, "' is a token file of `frugal prepare` (binary), not lines of ids: ",
           "give it as --token-file FILE --seq-len N");
    std::vector<int32_t> ids =
        parse_token_ids(line, detail::concat("eval: '", path, "' line ", number));
    if (!ids.empty()) lines.push_back(std::move(ids));
  }
  return lines;
}

// One document per non-empty line: bos (when `bos` >= 0), then the line's ids (no eos).
std::vector<std::vector<int32_t>> read_text_lines(const std::string& path,
                                                  const Tokenizer& tokenizer, int32_t bos) {
  require_regular_file(path, "eval: text file");
  std::ifstream in(path);
  if (!in) fail("eval: cannot read text file '", path, "'");
  std::vector<std::vector<int32_t>> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::vector<int32_t> ids;
    if (bos >= 0) ids.push_back(bos);
    const std::vector<int32_t> text = tokenizer.encode(line);
    ids.insert(ids.end(), text.begin(), text.end());
    lines.push_back(std::move(ids));
  }
  return lines;
}

}  // namespace

int cmd_eval(const std::vector<std::string>& args) {
  EvalOptions opt;
  po::options_description named("options");
  // clang-format off
  named.add_options()
      ("help,h", "print this help and exit")
      ("hf-model", po::value<std::string>(&opt.hf_dir)->value_name("DIR"),
       "a Hugging Face model directory (config.json, *.safetensors)")
      ("ckpt", po::value<std::string>(&opt.ckpt_path)->value_name("DIR"),
       "a frugal run directory, its ckpt/ directory, or one step directory")
      ("tokens", po::value<std::string>(&opt.tokens_path)->value_name("FILE"),
       "whitespace-separated token ids, one sequence per line")
      ("text", po::value<std::string>(&opt.text_path)->value_name("FILE"),
       "text, one document per non-empty line, encoded with the model's tokenizer as "
       "bos + ids (no eos; no bos where the tokenizer adds none, as Qwen2's)")
      ("token-file", po::value<std::string>(&opt.token_file_path)->value_name("FILE"),
       "a token file of `frugal prepare` (e.g. DIR/val.tok), cut into consecutive sequences "
       "of --seq-len ids")
      ("data", po::value<std::string>(&opt.data_path)->value_name("FILE"),
       "a file of JSON records (chat, instruction or text, as `frugal prepare` reads them): "
       "each document one sequence, encoded as prepare does (conversations with the model's "
       "chat template)")
      ("format", po::value<std::string>(&opt.format)->default_value(opt.format)->value_name("F"),
       "with --data: jsonl (the first record tells), messages, sharegpt, alpaca, completion")
      ("train-on", po::value<std::string>(&opt.train_on)->default_value(opt.train_on)
           ->value_name("MODE"),
       "with --token-file or --data: the targets that count, as data.train_on in training: "
       "auto, all, assistant, last_turn, completion")
      ("chat-template", po::value<std::string>(&opt.chat_template_path)->value_name("FILE"),
       "with --data: this Jinja template instead of the tokenizer's own")
      ("seq-len", po::value<int64_t>(&opt.seq_len)->value_name("N"),
       "with --token-file: tokens per sequence")
      ("packing", po::value<std::string>(&opt.packing)->default_value(opt.packing)
           ->value_name("MODE"),
       "with --token-file: the sequences as data.packing makes them in training: documents "
       "(whole documents packed, attention inside each), windows (consecutive ids across "
       "documents), pad (one document per sequence); auto: documents for instruction and chat "
       "data, windows for text")
      ("max-sequences", po::value<int64_t>(&opt.max_sequences)->value_name("K"),
       "with --token-file: evaluate the first K sequences only (default: all)")
      ("tokenizer", po::value<std::string>(&opt.tokenizer_path)->value_name("PATH"),
       "tokenizer.model or tokenizer.json for --text (default: the model's own)")
      ("bucket-tokens", po::value<int64_t>(&opt.bucket_tokens)->value_name("W"),
       "also report the loss by position, in buckets of W positions (the position of a "
       "prediction is that of the token it reads)")
      ("timing", po::bool_switch(&opt.timing),
       "also print \"seconds\", the wall time of the forwards (after loading), and "
       "\"tokens_per_s\", every token of every line over it (all ranks together)")
      ("device", po::value<std::string>(&opt.device)->default_value(opt.device)->value_name("D"),
       "cpu, cuda (one GPU per rank) or auto (the GPUs when every rank has one)")
      ("gpu-mem-limit", po::value<std::string>(&opt.gpu_mem_limit)
           ->default_value(opt.gpu_mem_limit)->value_name("BYTES"),
       "cap on each rank's GPU memory, e.g. 24GiB (0: the whole card)")
      ("quant", po::value<std::string>(&opt.quant)->default_value(opt.quant)->value_name("Q"),
       "none, nf4 (NF4 with double quantization) or hqq (HQQ 4-bit): store the blocks' "
       "linear weights 4-bit on load and evaluate with them (rows must be multiples of 64)")
      ("logits-out", po::value<std::string>(&opt.logits_path)->value_name("FILE"),
       "also write the logits of every position of every line, lines one after another, as "
       "raw little-endian float32 [positions, vocab] (one rank only)");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(named).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    fail("eval: ", program_options_message(e), " (see 'frugal eval --help')");
  }
  if (vm.count("help")) {
    std::cout
        << "usage: frugal eval (--hf-model DIR | --ckpt DIR)\n"
           "         (--tokens FILE | --text FILE | --token-file FILE --seq-len N |\n"
           "          --data FILE)\n\n"
           "Prints one JSON line {\"loss\": L, \"tokens\": N}: L is the mean next-token\n"
           "cross-entropy (natural log) over all N predicted positions, every position\n"
           "of a line but the first predicting the next id, as transformers' loss with\n"
           "labels = input_ids. For instruction and chat data (a token file that records\n"
           "replies, or --data) only the targets --train-on selects count, as in training\n"
           "(transformers' labels -100 elsewhere), and the line says \"train_on\".\n"
           "Lines are run one at a time, each from position 0; a\n"
           "line longer than the model's context is an error. With --bucket-tokens W the\n"
           "line also holds \"buckets\": [{\"first\", \"last\", \"loss\", \"tokens\"}...],\n"
           "the loss of the predictions made at positions first..last.\n\n"
           "Under mpirun -np R the weights are sharded over the ranks as in training (ZeRO-3:\n"
           "each rank holds 1/R of them) and the lines are shared out; the loss is the\n"
           "one rank's, summed in the same order.\n\n"
        << named << "\n";
    return 0;
  }
  if (int(!opt.tokens_path.empty()) + int(!opt.text_path.empty()) +
          int(!opt.token_file_path.empty()) + int(!opt.data_path.empty()) !=
      1)
    fail(
        "eval: give exactly one of --tokens FILE, --text FILE, --token-file FILE or --data FILE "
        "(see 'frugal eval --help')");
  const std::optional<TrainOn> train_on = enum_from_name<TrainOn>(opt.train_on);
  if (!train_on)
    fail("eval: --train-on '", opt.train_on, "' is not one of: ", enum_name_list<TrainOn>());
  const std::optional<Packing> packing = enum_from_name<Packing>(opt.packing);
  if (!packing)
    fail("eval: --packing '", opt.packing, "' is not one of: ", enum_name_list<Packing>());
  const std::optional<CorpusFormat> data_format = enum_from_name<CorpusFormat>(opt.format);
  if (!data_format)
    fail("eval: --format '", opt.format, "' is not one of: ", enum_name_list<CorpusFormat>());
  for (const std::string* p : {&opt.tokens_path, &opt.text_path, &opt.token_file_path,
                               &opt.data_path, &opt.tokenizer_path, &opt.chat_template_path})
    if (!p->empty() && !fs::is_regular_file(*p)) fail("eval: '", *p, "' does not exist");
  if (opt.bucket_tokens < 0) fail("eval: --bucket-tokens ", opt.bucket_tokens, " must be > 0");

  ShardedModelOptions load;
  load.hf_dir = opt.hf_dir;
  load.ckpt_path = opt.ckpt_path;
  load.quant = quant_kind_from_name(opt.quant);
  load.device = device_choice_from_option("eval", opt.device);
  load.gpu_mem_limit = opt.gpu_mem_limit;
  ShardedModel model("eval", load);
  const LlamaConfig& c = model.config();
  Comm& world = model.world();
  if (!opt.logits_path.empty() && world.size() > 1)
    fail("eval: --logits-out runs on one rank, not ", world.size());
  EvalLines eval_lines;
  std::string input = opt.tokens_path;
  if (!opt.tokens_path.empty()) {
    eval_lines.ids = read_token_lines(opt.tokens_path);
  } else if (!opt.token_file_path.empty()) {
    input = opt.token_file_path;
    eval_lines =
        read_token_file(opt.token_file_path, opt.seq_len, opt.max_sequences, *train_on, *packing);
  } else if (!opt.data_path.empty()) {
    input = opt.data_path;
    const std::string tokenizer_path =
        opt.tokenizer_path.empty() ? model.tokenizer_path() : opt.tokenizer_path;
    if (tokenizer_path.empty())
      fail("eval: --data needs a tokenizer, and ", model.source(),
           " has no tokenizer.model or tokenizer.json: pass --tokenizer PATH");
    eval_lines = read_data_file(opt.data_path, *data_format, *train_on, tokenizer_path,
                                opt.chat_template_path, model.eos_id());
  } else {
    input = opt.text_path;
    const std::string tokenizer_path =
        opt.tokenizer_path.empty() ? model.tokenizer_path() : opt.tokenizer_path;
    if (tokenizer_path.empty())
      fail("eval: --text needs a tokenizer, and ", model.source(),
           " has no tokenizer.model or tokenizer.json: pass --tokenizer PATH");
    Tokenizer tokenizer(tokenizer_path);
    if (tokenizer.vocab_size() > c.vocab_size)
      fail("eval: tokenizer '", tokenizer_path, "' has ", tokenizer.vocab_size(),
           " pieces, more than the model's vocab_size ", c.vocab_size);
    const int32_t bos = !tokenizer.prepends_bos() ? -1
                        : tokenizer.bos_id() >= 0 ? tokenizer.bos_id()
                                                  : model.bos_id();
    eval_lines.ids = read_text_lines(opt.text_path, tokenizer, bos);
  }
  const std::vector<std::vector<int32_t>>& lines = eval_lines.ids;
  const std::vector<std::vector<bool>>& counted = eval_lines.counted;
  if (lines.empty()) fail("eval: '", input, "' holds no sequences");
  int64_t longest = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto n = static_cast<int64_t>(lines[i].size());
    longest = std::max(longest, n);
    if (n > c.context_length())
      fail("eval: '", input, "' sequence ", i + 1, " has ", n,
           " tokens, more than the model's context of ", c.context_length(),
           " tokens (max_position_embeddings = ", c.max_position_embeddings, "); split it");
    for (int32_t id : lines[i])
      if (id >= c.vocab_size)
        fail("eval: '", input, "' sequence ", i + 1, ": token id ", id,
             " is outside the model's vocabulary [0, ", c.vocab_size, ")");
  }

  std::ofstream logits_out;
  if (!opt.logits_path.empty()) {
    logits_out.open(opt.logits_path, std::ios::binary | std::ios::trunc);
    if (!logits_out) fail("eval: cannot write '", opt.logits_path, "'");
  }
  // Positions [b W, (b + 1) W) form bucket b; without buckets, one bucket holds them all.
  const int64_t width = opt.bucket_tokens > 0 ? opt.bucket_tokens : longest;
  const int64_t buckets = (longest + width - 1) / width;
  // Line i runs on rank i % R. Every rank runs the same number of forwards (the gathers of
  // the sharded weights are collective): one with no line left runs a one-token stand-in.
  LlamaModel llama(c);
  const int ranks = world.size(), rank = world.rank();
  const auto count = static_cast<int64_t>(lines.size());
  std::vector<double> line_bucket_sums(static_cast<size_t>(count * buckets), 0.0);
  world.barrier();  // the timing starts when every rank has loaded its shards
  const auto start = std::chrono::steady_clock::now();
  for (int64_t round = 0; round * ranks < count; ++round) {
    const int64_t i = round * ranks + rank;
    if (i >= count) {
      llama.forward_loss(next_token_batch(std::vector<int32_t>{0}), model.params());
      continue;
    }
    const std::vector<int32_t>& ids = lines[static_cast<size_t>(i)];
    const auto n = static_cast<int64_t>(ids.size());
    Batch b = next_token_batch(ids);
    if (!eval_lines.document_start.empty()) {
      // Packed documents: attention inside each, positions restarting at each.
      const std::vector<int32_t>& start = eval_lines.document_start[static_cast<size_t>(i)];
      const std::vector<int32_t>& end = eval_lines.document_end[static_cast<size_t>(i)];
      b.documents.start = Tensor::empty({n}, DType::i32);
      b.documents.end = Tensor::empty({n}, DType::i32);
      std::copy(start.begin(), start.end(), b.documents.start.data<int32_t>());
      std::copy(end.begin(), end.end(), b.documents.end.data<int32_t>());
      for (int64_t j = 0; j < n; ++j)
        b.positions.data<int32_t>()[j] = int32_t(j) - start[static_cast<size_t>(j)];
    }
    if (!counted.empty())
      for (int64_t j = 0; j < n; ++j)
        if (!counted[static_cast<size_t>(i)][static_cast<size_t>(j)])
          b.targets.data<int32_t>()[j] = kIgnoreTarget;
    if (logits_out.is_open()) {
      Tensor logits = llama.forward_logits(b, model.params());
      logits_out.write(static_cast<const char*>(logits.raw()),
                       static_cast<std::streamsize>(logits.bytes()));
    }
    std::vector<int64_t> row_ends;
    for (int64_t end = width; end < n; end += width) row_ends.push_back(end);
    row_ends.push_back(n);
    const std::vector<double> sums = llama.forward_loss_sums(b, model.params(), row_ends);
    for (size_t k = 0; k < sums.size(); ++k)
      line_bucket_sums[static_cast<size_t>(i * buckets) + k] = sums[k];
  }
  // Each value is held by one rank (the others add zeros, exactly), then summed in line order
  // as one rank sums it: the loss does not depend on the number of ranks.
  if (ranks > 1)
    for (double& v : line_bucket_sums) v = world.all_reduce_sum(v);
  // The losses were read back from the device: the forwards are done.
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double loss_sum = 0;
  int64_t predicted = 0;
  std::vector<double> bucket_sum(static_cast<size_t>(buckets), 0.0);
  std::vector<int64_t> bucket_count(static_cast<size_t>(buckets), 0);
  for (int64_t i = 0; i < count; ++i) {
    const auto n = static_cast<int64_t>(lines[static_cast<size_t>(i)].size());
    for (int64_t k = 0; k < buckets; ++k) {
      const double v = line_bucket_sums[static_cast<size_t>(i * buckets + k)];
      loss_sum += v;
      bucket_sum[static_cast<size_t>(k)] += v;
      // Positions 0 .. n - 2 predict (those whose target counts); the last reads the end.
      int64_t in_bucket = 0;
      for (int64_t j = k * width; j < std::min(n - 1, (k + 1) * width); ++j)
        in_bucket += counted.empty() || counted[static_cast<size_t>(i)][static_cast<size_t>(j)];
      bucket_count[static_cast<size_t>(k)] += in_bucket;
      predicted += in_bucket;
    }
  }
  if (logits_out.is_open()) {
    logits_out.close();
    if (!logits_out) fail("eval: writing '", opt.logits_path, "' failed");
  }
  if (predicted == 0)
    fail("eval: '", input, "' has no position to predict: ",
         counted.empty() ? "every sequence has one token"
                         : "every target is masked (--train-on " + eval_lines.train_on + ")");
  const double loss = loss_sum / static_cast<double>(predicted);
  // JSON has no NaN: it would print as null with exit 0, as if all were well.
  if (!std::isfinite(loss))
    fail("eval: the loss of ", model.source(), " on '", input, "' is ", loss,
         " (its weights overflow the forward pass, or are not finite)");
  nlohmann::ordered_json result = {{"loss", loss}, {"tokens", predicted}};
  if (!eval_lines.train_on.empty()) result["train_on"] = eval_lines.train_on;
  if (!eval_lines.packing.empty()) result["packing"] = eval_lines.packing;
  if (opt.timing) {
    int64_t line_tokens = 0;
    for (const auto& ids : lines) line_tokens += static_cast<int64_t>(ids.size());
    result["seconds"] = seconds;
    result["tokens_per_s"] = static_cast<double>(line_tokens) / seconds;
  }
  if (opt.bucket_tokens > 0) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (int64_t k = 0; k < buckets; ++k) {
      const int64_t n = bucket_count[static_cast<size_t>(k)];
      if (n == 0) continue;
      rows.push_back({{"first", k * width},
                      {"last", k * width + width - 1},
                      {"loss", bucket_sum[static_cast<size_t>(k)] / static_cast<double>(n)},
                      {"tokens", n}});
    }
    result["buckets"] = rows;
  }
  if (rank == 0) std::cout << result.dump() << std::endl;
  return 0;
}

}  // namespace frugal
