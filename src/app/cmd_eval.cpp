// `frugal eval`: the mean next-token cross-entropy of a model (a Hugging Face directory or a
// frugal checkpoint) on token ids or text, printed as one JSON line. Also the loader that
// eval, generate and export share.
#include <mpi.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/commands.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "model/hf_model.h"
#include "model/llama_model.h"
#include "quant/quantized_parameters.h"
#include "train/saved_model.h"

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
  std::string hf_dir, ckpt_path, tokens_path, text_path, tokenizer_path, logits_path;
  std::string quant = "none";
};

// Whitespace-separated ids, one sequence per line; blank lines are skipped.
std::vector<std::vector<int32_t>> read_token_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("eval: cannot read token file '", path, "'");
  std::vector<std::vector<int32_t>> lines;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    std::istringstream words(line);
    std::vector<int32_t> ids;
    for (std::string word; words >> word;) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size() || id < 0 || id > INT32_MAX)
        fail("eval: '", path, "' line ", number, ": '", word, "' is not a token id");
      ids.push_back(static_cast<int32_t>(id));
    }
    if (!ids.empty()) lines.push_back(std::move(ids));
  }
  return lines;
}

// One document per non-empty line: bos, then the line's ids (no eos).
std::vector<std::vector<int32_t>> read_text_lines(const std::string& path,
                                                  const Tokenizer& tokenizer, int32_t bos) {
  std::ifstream in(path);
  if (!in) fail("eval: cannot read text file '", path, "'");
  std::vector<std::vector<int32_t>> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::vector<int32_t> ids{bos};
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
       "text, one document per non-empty line, encoded with the model's tokenizer.model as "
       "bos + ids (no eos)")
      ("tokenizer", po::value<std::string>(&opt.tokenizer_path)->value_name("PATH"),
       "tokenizer.model for --text (default: the model's own)")
      ("quant", po::value<std::string>(&opt.quant)->default_value(opt.quant)->value_name("Q"),
       "none, nf4 (NF4 with double quantization) or hqq (HQQ 4-bit): store the blocks' "
       "linear weights 4-bit on load and evaluate with them (rows must be multiples of 64)")
      ("logits-out", po::value<std::string>(&opt.logits_path)->value_name("FILE"),
       "also write the logits of every position of every line, lines one after another, as "
       "raw little-endian float32 [positions, vocab]");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(named).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    fail("eval: ", e.what(), " (see 'frugal eval --help')");
  }
  if (vm.count("help")) {
    std::cout
        << "usage: frugal eval (--hf-model DIR | --ckpt DIR) (--tokens FILE | --text FILE)\n\n"
           "Prints one JSON line {\"loss\": L, \"tokens\": N}: L is the mean next-token\n"
           "cross-entropy (natural log) over all N predicted positions, every position\n"
           "of a line but the first predicting the next id, as transformers' loss with\n"
           "labels = input_ids. Lines are run one at a time, each from position 0; a\n"
           "line longer than the model's max_position_embeddings is an error.\n\n"
        << named << "\n";
    return 0;
  }
  if (opt.tokens_path.empty() == opt.text_path.empty())
    fail("eval: give exactly one of --tokens FILE or --text FILE (see 'frugal eval --help')");
  for (const std::string* p : {&opt.tokens_path, &opt.text_path, &opt.tokenizer_path})
    if (!p->empty() && !fs::is_regular_file(*p)) fail("eval: '", *p, "' does not exist");

  const QuantKind quant = quant_kind_from_name(opt.quant);
  InferenceModel model = load_inference_model("eval", opt.hf_dir, opt.ckpt_path);
  const LlamaConfig& c = model.config;
  // With --quant the linear layers are quantized tensor by tensor and the fp32 copy dropped.
  std::unique_ptr<ParameterProvider> weights;
  if (quant == QuantKind::none) {
    weights = std::move(model.params);
  } else {
    LocalParameters& whole = *model.params;
    weights = std::make_unique<QuantizedParameters>(
        llama_units(c), quant, [&](const ParamSpec& p) { return whole.param(p.name); });
    model.params.reset();
  }
  std::vector<std::vector<int32_t>> lines;
  std::string input = opt.tokens_path;
  if (!opt.tokens_path.empty()) {
    lines = read_token_lines(opt.tokens_path);
  } else {
    input = opt.text_path;
    const std::string tokenizer_path =
        opt.tokenizer_path.empty() ? model.tokenizer_path : opt.tokenizer_path;
    if (tokenizer_path.empty())
      fail("eval: --text needs a tokenizer, and ", model.source,
           " has no tokenizer.model: pass --tokenizer PATH");
    Tokenizer tokenizer(tokenizer_path);
    if (tokenizer.vocab_size() > c.vocab_size)
      fail("eval: tokenizer '", tokenizer_path, "' has ", tokenizer.vocab_size(),
           " pieces, more than the model's vocab_size ", c.vocab_size);
    const int32_t bos = tokenizer.bos_id() >= 0 ? tokenizer.bos_id() : model.bos_id;
    lines = read_text_lines(opt.text_path, tokenizer, bos);
  }
  if (lines.empty()) fail("eval: '", input, "' holds no sequences");
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto n = static_cast<int64_t>(lines[i].size());
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
  LlamaModel llama(c);
  double loss_sum = 0;
  int64_t count = 0;
  for (const std::vector<int32_t>& ids : lines) {
    const auto n = static_cast<int64_t>(ids.size());
    const Batch b = next_token_batch(ids);
    if (logits_out.is_open()) {
      Tensor logits = llama.forward_logits(b, *weights);
      logits_out.write(static_cast<const char*>(logits.raw()),
                       static_cast<std::streamsize>(logits.bytes()));
    }
    if (n < 2) continue;
    loss_sum += llama.forward_loss(b, *weights);
    count += n - 1;
  }
  if (logits_out.is_open()) {
    logits_out.close();
    if (!logits_out) fail("eval: writing '", opt.logits_path, "' failed");
  }
  if (count == 0)
    fail("eval: '", input, "' has no position to predict: every sequence has one token");
  const double loss = loss_sum / static_cast<double>(count);
  // JSON has no NaN: it would print as null with exit 0, as if all were well.
  if (!std::isfinite(loss))
    fail("eval: the loss of ", model.source, " on '", input, "' is ", loss,
         " (its weights overflow the forward pass, or are not finite)");
  nlohmann::ordered_json result = {{"loss", loss}, {"tokens", count}};
  std::cout << result.dump() << std::endl;
  return 0;
}

}  // namespace frugal
