// Chat templates against transformers and TRL: the fixtures of tests/fixtures/chat (made by
// tools/make_chat_fixtures.py with the real templates of Llama 3.1 Instruct, Qwen2 Instruct,
// Mistral Instruct and Llama 2 chat): the rendered text, the token ids, the trained positions
// of every conversation, and TRL's completion masks of prompt/completion pairs.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/error.h"
#include "data/chat_template.h"
#include "data/document_tokens.h"
#include "data/records.h"
#include "data/tokenizer.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace frugal;
using json = nlohmann::json;
using frugal::test::error_of;

namespace {

const fs::path kFixtures = fs::path(FRUGAL_SOURCE_DIR) / "tests" / "fixtures" / "chat";

std::vector<json> read_lines(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(json::parse(line));
  return lines;
}

std::map<std::string, Conversation> fixture_conversations() {
  std::map<std::string, Conversation> out;
  for (const json& j : read_lines(kFixtures / "conversations.jsonl")) {
    Conversation c;
    for (const json& m : j["messages"])
      c.push_back({*enum_from_name<ChatRole>(m["role"].get<std::string>()),
                   m["content"].get<std::string>()});
    out[j["name"].get<std::string>()] = c;
  }
  return out;
}

struct Model {
  std::string name;
  Tokenizer tokenizer;
  ChatTemplate chat;
};

Model load_model(const std::string& name) {
  const std::string path = find_tokenizer((kFixtures / name).string());
  REQUIRE_FALSE(path.empty());
  Tokenizer tokenizer(path);
  const int32_t bos = tokenizer.bos_id();
  std::optional<ChatTemplate> chat =
      find_chat_template(path, "", bos >= 0 ? tokenizer.piece(bos) : std::string(),
                         tokenizer.piece(tokenizer.eos_id()));
  REQUIRE(chat.has_value());
  return {name, std::move(tokenizer), std::move(*chat)};
}

const char* const kModels[] = {"llama3_1", "qwen2", "mistral", "llama2"};

}  // namespace

TEST_CASE("chat templates render and tokenize as transformers' apply_chat_template",
          "[data][chat]") {
  const auto conversations = fixture_conversations();
  for (const char* name : kModels) {
    const Model model = load_model(name);
    int checked = 0, refused = 0;
    for (const json& expected : read_lines(kFixtures / (std::string(name) + ".expected.jsonl"))) {
      const std::string case_name = expected["name"].get<std::string>();
      const bool generation = expected["add_generation_prompt"].get<bool>();
      INFO(name << " / " << case_name << " / add_generation_prompt " << generation);
      const Conversation& messages = conversations.at(case_name);
      if (expected.contains("error")) {
        const std::string message = error_of([&] { model.chat.render(messages, generation); });
        CHECK(message.find("raised an exception: " + expected["error"].get<std::string>()) !=
              std::string::npos);
        ++refused;
        continue;
      }
      const std::string text = model.chat.render(messages, generation);
      CHECK(text == expected["text"].get<std::string>());
      CHECK(model.tokenizer.encode_template_output(text).ids ==
            expected["ids"].get<std::vector<int32_t>>());
      ++checked;
    }
    INFO(name);
    CHECK(checked >= 20);
    if (std::string(name) == "mistral") CHECK(refused >= 4);
  }
}

TEST_CASE("trained positions of conversations equal TRL's assistant-only masks", "[data][chat]") {
  const auto conversations = fixture_conversations();
  for (const char* name : kModels) {
    const Model model = load_model(name);
    const DocumentEncoder encoder(model.tokenizer, &model.chat);
    int checked = 0;
    for (const json& expected : read_lines(kFixtures / (std::string(name) + ".expected.jsonl"))) {
      if (!expected.contains("assistant_masks")) continue;
      const std::string case_name = expected["name"].get<std::string>();
      INFO(name << " / " << case_name);
      CorpusDocument doc;
      doc.content = DocumentContent::chat;
      doc.conversation = conversations.at(case_name);
      doc.where = case_name;
      bool any_assistant = false;
      for (const ChatMessage& m : doc.conversation)
        any_assistant = any_assistant || m.role == ChatRole::assistant;
      const TokenizedDocument encoded = encoder.encode(doc);
      CHECK(encoded.ids == expected["ids"].get<std::vector<int32_t>>());
      const auto assistant = expected["assistant_masks"].get<std::vector<int>>();
      const auto last = expected["last_turn_masks"].get<std::vector<int>>();
      REQUIRE(encoded.roles.size() == assistant.size());
      for (size_t i = 0; i < assistant.size(); ++i) {
        INFO("token " << i);
        CHECK((encoded.roles[i] != TokenRole::prompt) == bool(assistant[i]));
        CHECK((encoded.roles[i] == TokenRole::last_reply) == bool(last[i]));
      }
      if (any_assistant) ++checked;
    }
    INFO(name);
    CHECK(checked >= 8);
  }
}

TEST_CASE("a conversation that starts with the assistant is refused by name", "[data][chat]") {
  const auto conversations = fixture_conversations();
  const Model model = load_model("qwen2");
  const DocumentEncoder encoder(model.tokenizer, &model.chat);
  CorpusDocument doc;
  doc.content = DocumentContent::chat;
  doc.conversation = conversations.at("assistant_first");
  doc.where = "chat.jsonl:7";
  CHECK(error_of([&] {
          encoder.encode(doc);
        }).find("chat.jsonl:7: the conversation starts with an assistant turn") !=
        std::string::npos);
}

TEST_CASE("prompt/completion pairs encode as TRL's SFTTrainer with completion-only loss",
          "[data][chat]") {
  for (const char* name : kModels) {
    const Model model = load_model(name);
    const DocumentEncoder encoder(model.tokenizer, nullptr);
    int checked = 0;
    for (const json& expected : read_lines(kFixtures / (std::string(name) + ".completion.jsonl"))) {
      INFO(name << " / " << expected["name"].get<std::string>());
      CorpusDocument doc;
      doc.content = DocumentContent::instruction;
      doc.text = expected["prompt"].get<std::string>();
      doc.completion = expected["completion"].get<std::string>();
      const TokenizedDocument encoded = encoder.encode(doc);
      CHECK(encoded.ids == expected["ids"].get<std::vector<int32_t>>());
      const auto mask = expected["completion_mask"].get<std::vector<int>>();
      REQUIRE(encoded.roles.size() == mask.size());
      for (size_t i = 0; i < mask.size(); ++i) {
        INFO("token " << i);
        CHECK((encoded.roles[i] != TokenRole::prompt) == bool(mask[i]));
      }
      ++checked;
    }
    CHECK(checked >= 6);
  }
}
