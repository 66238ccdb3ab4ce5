// `frugal generate`: continues a prompt with a model (a Hugging Face directory or a frugal
// checkpoint), greedy or sampled, with a KV cache, on the CPU or GPUs, on one rank or several
// (weights sharded over them as in training; every rank runs the same sequence).
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/options.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "data/chat_template.h"
#include "data/records.h"
#include "data/text_stream.h"
#include "data/tokenizer.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"
#include "model/sampling.h"
#include "quant/quantized_parameters.h"
#include "train/chat_template_trial.h"
#include "train/sharded_model.h"

namespace frugal {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

struct GenerateOptions {
  std::string hf_dir, ckpt_path, prompt, prompt_ids, tokenizer_path;
  std::string system, messages_path, chat_template_path;
  bool chat = false;
  std::string device = "auto", gpu_mem_limit = "0", quant = "none";
  int64_t max_new_tokens = 32;
  float temperature = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  bool print_ids = false;
  bool no_bos = false;
  bool ignore_eos = false;
  bool no_cache = false;
};

// The conversation to answer: --messages FILE ({"messages": [...]}, or the list alone), or
// --system and --prompt.
Conversation chat_messages(const GenerateOptions& opt) {
  Conversation messages;
  if (!opt.messages_path.empty()) {
    const std::string text = read_regular_file(opt.messages_path, "generate: --messages file");
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail("generate: --messages '", opt.messages_path, "' is not valid JSON: ", e.what());
    }
    if (record.is_array()) record = {{"messages", record}};
    messages = document_from_record(record, RecordFormat::messages, opt.messages_path).conversation;
  } else {
    if (!opt.system.empty()) messages.push_back({ChatRole::system, opt.system});
    messages.push_back({ChatRole::user, opt.prompt});
  }
  if (messages.back().role == ChatRole::assistant)
    fail("generate: the conversation ends with an assistant turn: its last message must be the ",
         "user's, for the model to answer");
  return messages;
}

}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  GenerateOptions opt;
  po::options_description named("options");
  // clang-format off
  named.add_options()
      ("help,h", "print this help and exit")
      ("hf-model", po::value<std::string>(&opt.hf_dir)->value_name("DIR"),
       "a Hugging Face model directory (config.json, *.safetensors, tokenizer.model)")
      ("ckpt", po::value<std::string>(&opt.ckpt_path)->value_name("DIR"),
       "a frugal run directory, its ckpt/ directory, or one step directory")
      ("prompt", po::value<std::string>(&opt.prompt)->value_name("TEXT"),
       "the prompt, encoded with the tokenizer as bos + ids; with --chat, the user's message")
      ("chat", po::bool_switch(&opt.chat),
       "chat: render the conversation (--system and --prompt, or --messages) with the model's "
       "chat template and its generation prompt, stop at the model's end-of-turn ids "
       "(generation_config.json's eos_token_id), print the reply alone")
      ("system", po::value<std::string>(&opt.system)->value_name("TEXT"),
       "with --chat: a system message before the prompt")
      ("messages", po::value<std::string>(&opt.messages_path)->value_name("FILE"),
       "with --chat: the conversation so far, a JSON file {\"messages\": [{\"role\", "
       "\"content\"}...]} ending with the user's message (instead of --prompt)")
      ("chat-template", po::value<std::string>(&opt.chat_template_path)->value_name("FILE"),
       "with --chat: this Jinja template instead of the tokenizer's own")
      ("prompt-ids", po::value<std::string>(&opt.prompt_ids)->value_name("\"IDS\""),
       "the prompt as whitespace-separated token ids, used as given (no bos added)")
      ("max-new-tokens", po::value<int64_t>(&opt.max_new_tokens)->default_value(opt.max_new_tokens)
           ->value_name("N"),
       "tokens to generate at most (fewer when eos comes first)")
      ("temperature", po::value<float>(&opt.temperature)->default_value(opt.temperature)
           ->value_name("T"),
       "0: greedy (argmax); > 0: sample from softmax(logits / T)")
      ("top-p", po::value<float>(&opt.top_p)->default_value(opt.top_p)->value_name("P"),
       "with T > 0, sample from the smallest set of tokens whose probability reaches P")
      ("seed", po::value<uint64_t>(&opt.seed)->default_value(opt.seed)->value_name("S"),
       "seed of the sampler")
      ("ids", po::bool_switch(&opt.print_ids),
       "print the token ids (prompt, then the new ones) instead of the text")
      ("no-bos", po::bool_switch(&opt.no_bos), "do not put bos before a --prompt")
      ("ignore-eos", po::bool_switch(&opt.ignore_eos),
       "keep generating after eos (default: stop at the model's eos)")
      ("no-cache", po::bool_switch(&opt.no_cache),
       "re-run the whole prefix for every token instead of using the KV cache (same tokens, "
       "slower; for checking)")
      ("tokenizer", po::value<std::string>(&opt.tokenizer_path)->value_name("PATH"),
       "tokenizer.model or tokenizer.json to use (default: the model's own)")
      ("device", po::value<std::string>(&opt.device)->default_value(opt.device)->value_name("D"),
       "cpu, cuda (one GPU per rank) or auto (the GPUs when every rank has one)")
      ("gpu-mem-limit", po::value<std::string>(&opt.gpu_mem_limit)
           ->default_value(opt.gpu_mem_limit)->value_name("BYTES"),
       "cap on each rank's GPU memory, e.g. 24GiB (0: the whole card)")
      ("quant", po::value<std::string>(&opt.quant)->default_value(opt.quant)->value_name("Q"),
       "none, nf4 or hqq: store the blocks' linear weights 4-bit on load");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(named).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    fail("generate: ", program_options_message(e), " (see 'frugal generate --help')");
  }
  if (vm.count("help")) {
    std::cout << "usage: frugal generate (--hf-model DIR | --ckpt DIR)\n"
                 "         (--prompt TEXT | --prompt-ids \"IDS\" | --chat (--prompt TEXT |\n"
                 "          --messages FILE)) [options]\n\n"
                 "Prints the prompt and its continuation: the text, or with --ids the token\n"
                 "ids on one line. With --chat, the model's reply alone: the conversation is\n"
                 "rendered with the model's chat template and its generation prompt, and the\n"
                 "reply stops at any of the model's end-of-turn ids. Greedy unless\n"
                 "--temperature is given; stops at eos or after --max-new-tokens, or where\n"
                 "prompt and continuation fill the model's context (max_position_embeddings;\n"
                 "a longer prompt is refused). Under mpirun the weights are sharded over the\n"
                 "ranks as in training, every rank takes rank 0's tokens, and rank 0 prints.\n\n"
              << named << "\n";
    return 0;
  }
  if (!opt.messages_path.empty() || !opt.system.empty() || !opt.chat_template_path.empty())
    if (!opt.chat) fail("generate: --messages, --system and --chat-template go with --chat");
  if (opt.chat) {
    if (vm.count("prompt-ids")) fail("generate: --chat takes --prompt TEXT or --messages FILE");
    if (vm.count("prompt") == !opt.messages_path.empty())
      fail("generate: with --chat give exactly one of --prompt TEXT or --messages FILE");
  } else if (vm.count("prompt") == vm.count("prompt-ids")) {
    fail(
        "generate: give exactly one of --prompt TEXT or --prompt-ids \"IDS\" (see 'frugal "
        "generate --help')");
  }
  if (opt.max_new_tokens < 0)
    fail("generate: --max-new-tokens ", opt.max_new_tokens, " must be >= 0");
  if (!(opt.temperature >= 0)) fail("generate: --temperature ", opt.temperature, " must be >= 0");
  if (!(opt.top_p > 0 && opt.top_p <= 1))
    fail("generate: --top-p ", opt.top_p, " is not in (0, 1]");
  if (!opt.tokenizer_path.empty() && !fs::is_regular_file(opt.tokenizer_path))
    fail("generate: tokenizer '", opt.tokenizer_path, "' does not exist");

  ShardedModelOptions load;
  load.hf_dir = opt.hf_dir;
  load.ckpt_path = opt.ckpt_path;
  load.quant = quant_kind_from_name(opt.quant);
  load.device = device_choice_from_option("generate", opt.device);
  load.gpu_mem_limit = opt.gpu_mem_limit;
  ShardedModel model("generate", load);
  const LlamaConfig& c = model.config();
  const std::string tokenizer_path =
      opt.tokenizer_path.empty() ? model.tokenizer_path() : opt.tokenizer_path;
  std::unique_ptr<Tokenizer> tokenizer;
  if (!tokenizer_path.empty()) {
    tokenizer = std::make_unique<Tokenizer>(tokenizer_path);
    if (tokenizer->vocab_size() > c.vocab_size)
      fail("generate: tokenizer '", tokenizer_path, "' has ", tokenizer->vocab_size(),
           " pieces, more than the model's vocab_size ", c.vocab_size);
  }
  if (!tokenizer && (vm.count("prompt") || opt.chat || !opt.print_ids))
    fail("generate: ", model.source(), " has no tokenizer.model or tokenizer.json, needed for ",
         opt.chat             ? "--chat"
         : vm.count("prompt") ? "--prompt"
                              : "printing text",
         ": pass --tokenizer PATH, or use --prompt-ids and --ids");

  std::vector<int32_t> prompt;
  std::vector<int32_t> stop_tokens;
  if (!opt.ignore_eos) stop_tokens = {model.eos_id()};
  if (opt.chat) {
    const Conversation messages = chat_messages(opt);
    const int32_t bos = tokenizer->bos_id();
    const std::optional<ChatTemplate> chat = find_chat_template(
        tokenizer_path, opt.chat_template_path, bos >= 0 ? tokenizer->piece(bos) : std::string(),
        tokenizer->piece(tokenizer->eos_id() >= 0 ? tokenizer->eos_id() : model.eos_id()));
    if (!chat)
      fail("generate: --chat needs a chat template, and tokenizer '", tokenizer_path,
           "' has none beside it (tokenizer_config.json's chat_template, chat_template.jinja): ",
           "give --chat-template FILE");
    try_chat_template(*chat, std::span<const Conversation>(&messages, 1));
    prompt = tokenizer->encode_template_output(chat->render(messages, true)).ids;
    if (!opt.ignore_eos) stop_tokens = reply_end_ids(tokenizer_path, model.eos_id());
  } else if (vm.count("prompt")) {
    if (!opt.no_bos && tokenizer->prepends_bos())
      prompt.push_back(tokenizer->bos_id() >= 0 ? tokenizer->bos_id() : model.bos_id());
    const std::vector<int32_t> ids = tokenizer->encode(opt.prompt);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  } else {
    prompt = parse_token_ids(opt.prompt_ids, "generate: --prompt-ids");
  }
  if (prompt.empty()) fail("generate: the prompt is empty (give text, or keep the bos)");
  for (int32_t id : prompt)
    if (id >= c.vocab_size)
      fail("generate: prompt token id ", id, " is outside the model's vocabulary [0, ",
           c.vocab_size, ")");

  SamplingOptions sampling;
  sampling.max_new_tokens = new_tokens_within_context(
      c, static_cast<int64_t>(prompt.size()), opt.max_new_tokens, "generate: --max-new-tokens");
  sampling.temperature = opt.temperature;
  sampling.top_p = opt.top_p;
  sampling.seed = opt.seed;
  sampling.stop_tokens = stop_tokens;
  Comm& world = model.world();
  // Ranks take rank 0's token (ids are >= 0, the others offer -1).
  if (world.size() > 1)
    sampling.agree = [&world](int32_t token) {
      return static_cast<int32_t>(world.all_reduce_max(world.rank() == 0 ? token : -1));
    };
  // Rank 0 prints the sequence as it grows: the prompt (not a chat's rendered conversation),
  // then each token as it is chosen.
  TextStream text([&](const std::vector<int32_t>& ids) { return tokenizer->decode(ids); },
                  opt.chat ? std::vector<int32_t>{} : prompt);
  std::vector<int32_t> streamed = prompt;  // --ids
  if (world.rank() == 0) {
    if (opt.print_ids)
      for (size_t i = 0; i < prompt.size(); ++i) std::cout << (i ? " " : "") << prompt[i];
    else
      std::cout << text.start();
    std::cout << std::flush;
    sampling.on_token = [&](int32_t token) {
      if (opt.print_ids) {
        streamed.push_back(token);
        std::cout << " " << token << std::flush;
      } else {
        std::cout << text.push(token) << std::flush;
      }
    };
  }
  std::vector<int32_t> tokens;
  if (opt.no_cache) {
    LlamaModel llama(c);
    tokens = generate(llama, model.params(), prompt, sampling);
  } else {
    tokens = generate_cached(c, model.params(), prompt, sampling);
  }
  if (world.rank() != 0) return 0;
  std::vector<int32_t> printed = opt.print_ids ? streamed : text.tokens();
  if (opt.chat && !opt.print_ids) printed.insert(printed.begin(), prompt.begin(), prompt.end());
  FRUGAL_CHECK(printed == tokens, "generate: the printed tokens differ from the sequence");
  if (!opt.print_ids) std::cout << text.finish();
  std::cout << std::endl;
  return 0;
}

}  // namespace frugal
