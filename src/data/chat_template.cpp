// Chat templates through minja: parsing, the variables transformers gives a template, and
// finding a model's template beside its tokenizer.
#include "data/chat_template.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <minja/minja.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regular_file.h"

namespace frugal {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct ChatTemplate::Parsed {
  std::shared_ptr<minja::TemplateNode> root;
};

namespace {

// transformers' environment: trim_blocks and lstrip_blocks on, the template's last newline
// dropped (Jinja's keep_trailing_newline = False).
constexpr minja::Options kTransformersOptions{/*trim_blocks=*/true, /*lstrip_blocks=*/true,
                                              /*keep_trailing_newline=*/false};

// minja appends the template's location to an error once for every node it passes through:
// the first line says what went wrong.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string read_text(const fs::path& path, const char* what) {
  return read_regular_file(path.string(), what);
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& text, std::string source, TemplateTokens tokens)
    : text_(text), source_(std::move(source)), tokens_(std::move(tokens)) {
  auto parsed = std::make_shared<Parsed>();
  try {
    parsed->root = minja::Parser::parse(text, kTransformersOptions);
  } catch (const std::exception& e) {
    fail("chat template ", source_, " does not parse: ", first_line(e.what()));
  }
  parsed_ = std::move(parsed);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(std::span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
  json variables = json::object();
  json& list = variables["messages"] = json::array();
  for (const ChatMessage& m : messages)
    list.push_back({{"role", std::string(enum_name(m.role))}, {"content", m.content}});
  variables["add_generation_prompt"] = add_generation_prompt;
  variables["tools"] = nullptr;
  variables["documents"] = nullptr;
  for (const auto& [key, value] : {std::pair{"bos_token", &tokens_.bos},
                                   {"eos_token", &tokens_.eos},
                                   {"unk_token", &tokens_.unk},
                                   {"pad_token", &tokens_.pad}})
    if (!value->empty()) variables[key] = *value;
  auto context = minja::Context::make(minja::Value(variables));
  // What the template raised, told apart from a failure of the template itself.
  std::string raised;
  context->set("raise_exception",
               minja::Value::callable([&raised](const std::shared_ptr<minja::Context>&,
                                                minja::ArgumentsValue& args) -> minja::Value {
                 raised = args.args.empty()          ? std::string("(no message)")
                          : args.args[0].is_string() ? args.args[0].get<std::string>()
                                                     : args.args[0].dump();
                 throw std::runtime_error(raised);
               }));
  // transformers: datetime.now().strftime(format), as Llama 3.2's template dates its system text.
  context->set(
      "strftime_now", minja::Value::callable([](const std::shared_ptr<minja::Context>&,
                                                minja::ArgumentsValue& args) -> minja::Value {
        if (args.args.empty() || !args.args[0].is_string())
          throw std::runtime_error("strftime_now(format) needs a format string");
        const std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        char out[256];
        const size_t n =
            std::strftime(out, sizeof out, args.args[0].get<std::string>().c_str(), &local);
        return std::string(out, n);
      }));
  try {
    return parsed_->root->render(context);
  } catch (const std::exception& e) {
    if (!raised.empty()) fail("chat template ", source_, " raised an exception: ", raised);
    fail("chat template ", source_, " failed: ", first_line(e.what()));
  }
}

std::optional<ChatTemplate> find_chat_template(const std::string& tokenizer_path,
                                               const std::string& template_file,
                                               const std::string& bos_piece,
                                               const std::string& eos_piece) {
  const fs::path dir = fs::path(tokenizer_path).parent_path();
  const fs::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  json config = json::object();
  if (fs::exists(config_path, ec)) {
    const std::string text = read_text(config_path, "tokenizer config");
    try {
      config = json::parse(text);
    } catch (const json::exception& e) {
      fail("'", config_path.string(), "' is not valid JSON: ", e.what());
    }
    if (!config.is_object()) fail("'", config_path.string(), "' is not a JSON object");
  }
  // A special token's string: tokenizer_config.json's (a string or {"content": ...}; null:
  // none), else the tokenizer's own piece.
  auto token = [&](const char* key, const std::string& piece) -> std::string {
    if (!config.contains(key)) return piece;
    const json& v = config[key];
    if (v.is_null()) return "";
    const json& content = v.is_object() && v.contains("content") ? v["content"] : v;
    if (!content.is_string())
      fail("'", config_path.string(), "': key '", key, "' has value ", v.dump(),
           ", expected a token string");
    return content.get<std::string>();
  };
  TemplateTokens tokens{token("bos_token", bos_piece), token("eos_token", eos_piece),
                        token("unk_token", ""), token("pad_token", "")};

  if (!template_file.empty())
    return ChatTemplate(read_text(template_file, "chat template"), "'" + template_file + "'",
                        std::move(tokens));
  if (const fs::path jinja = dir / "chat_template.jinja"; fs::exists(jinja, ec))
    return ChatTemplate(read_text(jinja, "chat template"), "'" + jinja.string() + "'",
                        std::move(tokens));
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return std::nullopt;
  const json& entry = config["chat_template"];
  const std::string source = "'" + config_path.string() + "' (chat_template)";
  if (entry.is_string()) return ChatTemplate(entry.get<std::string>(), source, std::move(tokens));
  // Several named templates (tool use, RAG): transformers' default is the one named "default".
  if (entry.is_array())
    for (const json& named : entry)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string())
        return ChatTemplate(named["template"].get<std::string>(),
                            "'" + config_path.string() + "' (chat_template \"default\")",
                            std::move(tokens));
  fail(source, " is neither a template string nor a list holding one named \"default\"");
}

std::vector<int32_t> reply_end_ids(const std::string& tokenizer_path, int32_t eos_id) {
  std::vector<int32_t> ids;
  if (eos_id >= 0) ids.push_back(eos_id);
  const fs::path path = fs::path(tokenizer_path).parent_path() / "generation_config.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return ids;
  json config;
  try {
    config = json::parse(read_text(path, "generation config"));
  } catch (const json::exception& e) {
    fail("'", path.string(), "' is not valid JSON: ", e.what());
  }
  if (!config.is_object() || !config.contains("eos_token_id") || config["eos_token_id"].is_null())
    return ids;
  const json& value = config["eos_token_id"];
  const json list = value.is_array() ? value : json::array({value});
  for (const json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      fail("'", path.string(), "': eos_token_id ", value.dump(),
           " is not a token id or a list of them");
    if (std::find(ids.begin(), ids.end(), id.get<int32_t>()) == ids.end())
      ids.push_back(id.get<int32_t>());
  }
  return ids;
}

}  // namespace frugal
