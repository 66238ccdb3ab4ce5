// Instruction and chat records: detection by keys, and each format read into a document.
#include "data/records.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace frugal {

using json = nlohmann::json;

namespace {

bool is_blank(std::string_view text) {
  return text.find_first_not_of(" \t\n\r\f\v") == std::string_view::npos;
}

// A string field; absent or null: "" when `optional`, else an Error.
std::string string_field(const json& record, const char* key, const std::string& where,
                         bool optional = false) {
  auto it = record.find(key);
  if (it == record.end() || it->is_null()) {
    if (optional) return "";
    fail(where, ": the record has no \"", key, "\" field");
  }
  if (!it->is_string()) fail(where, ": field '", key, "' is not a string (", it->type_name(), ")");
  return it->get<std::string>();
}

// ShareGPT's speakers, as LLaMA-Factory and Axolotl read them.
std::optional<ChatRole> sharegpt_role(const std::string& from) {
  if (from == "system") return ChatRole::system;
  if (from == "human" || from == "user") return ChatRole::user;
  if (from == "gpt" || from == "assistant") return ChatRole::assistant;
  return std::nullopt;
}

Conversation read_conversation(const json& list, const char* list_key, const char* role_key,
                               const char* content_key, bool sharegpt, const std::string& where) {
  if (!list.is_array())
    fail(where, ": \"", list_key, "\" is not a list of messages (", list.type_name(), ")");
  if (list.empty()) fail(where, ": \"", list_key, "\" is an empty conversation");
  Conversation conversation;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = where + ": message " + std::to_string(i);
    const json& m = list[i];
    if (!m.is_object()) fail(at, " is not an object (", m.type_name(), ")");
    const std::string role_name = string_field(m, role_key, at);
    const std::optional<ChatRole> role =
        sharegpt ? sharegpt_role(role_name) : enum_from_name<ChatRole>(role_name);
    if (!role)
      fail(at, ": unknown role '", role_name, "' (", role_key, " must be one of: ",
           sharegpt ? "system, human, gpt (or user, assistant)" : enum_name_list<ChatRole>(), ")");
    auto content = m.find(content_key);
    if (content == m.end() || content->is_null())
      fail(at, " (", role_name, ") has no \"", content_key, "\"");
    if (!content->is_string())
      fail(at, " (", role_name, "): \"", content_key, "\" is ", content->type_name(),
           ", not a string (content parts, as images or tool calls, are not supported)");
    ChatMessage message{*role, content->get<std::string>()};
    if (message.role == ChatRole::assistant && is_blank(message.content))
      fail(at, " is an empty assistant turn: there is nothing to learn from it");
    conversation.push_back(std::move(message));
  }
  return conversation;
}

}  // namespace

std::string CorpusDocument::plain_text() const {
  switch (content) {
    case DocumentContent::text:
      return text;
    case DocumentContent::instruction:
      return text + completion;
    case DocumentContent::chat: {
      std::string all;
      for (const ChatMessage& m : conversation) {
        if (!all.empty()) all += "\n";
        all += m.content;
      }
      return all;
    }
  }
  return text;
}

size_t CorpusDocument::plain_bytes() const {
  switch (content) {
    case DocumentContent::text:
      return text.size();
    case DocumentContent::instruction:
      return text.size() + completion.size();
    case DocumentContent::chat: {
      size_t bytes = conversation.empty() ? 0 : conversation.size() - 1;  // the line ends
      for (const ChatMessage& m : conversation) bytes += m.content.size();
      return bytes;
    }
  }
  return text.size();
}

std::optional<RecordFormat> detect_record_format(const json& record) {
  if (!record.is_object()) return std::nullopt;
  if (record.contains("messages")) return RecordFormat::messages;
  if (record.contains("conversations")) return RecordFormat::sharegpt;
  if (record.contains("prompt") && record.contains("completion")) return RecordFormat::completion;
  if (record.contains("instruction") && record.contains("output")) return RecordFormat::alpaca;
  if (record.contains("text")) return RecordFormat::text;
  return std::nullopt;
}

CorpusDocument document_from_record(const json& record, RecordFormat format,
                                    const std::string& where) {
  if (!record.is_object()) fail(where, ": expected a JSON object, got ", record.type_name());
  CorpusDocument doc;
  doc.where = where;
  switch (format) {
    case RecordFormat::text:
      doc.text = string_field(record, "text", where);
      break;
    case RecordFormat::alpaca:
      doc.content = DocumentContent::instruction;
      doc.text = alpaca_prompt(string_field(record, "instruction", where),
                               string_field(record, "input", where, /*optional=*/true));
      doc.completion = string_field(record, "output", where);
      if (is_blank(doc.completion))
        fail(where, ": the output is empty: there is nothing to learn from it");
      break;
    case RecordFormat::completion:
      doc.content = DocumentContent::instruction;
      for (const char* key : {"prompt", "completion"})
        if (record.contains(key) && record[key].is_array())
          fail(where, ": \"", key, "\" is a list of messages (TRL's conversational form): ",
               "write the conversation as {\"messages\": [...]}");
      doc.text = string_field(record, "prompt", where);
      doc.completion = string_field(record, "completion", where);
      if (is_blank(doc.completion))
        fail(where, ": the completion is empty: there is nothing to learn from it");
      break;
    case RecordFormat::messages:
      doc.content = DocumentContent::chat;
      if (!record.contains("messages")) fail(where, ": the record has no \"messages\" list");
      doc.conversation =
          read_conversation(record["messages"], "messages", "role", "content", false, where);
      break;
    case RecordFormat::sharegpt:
      doc.content = DocumentContent::chat;
      if (!record.contains("conversations"))
        fail(where, ": the record has no \"conversations\" list");
      doc.conversation =
          read_conversation(record["conversations"], "conversations", "from", "value", true, where);
      break;
  }
  return doc;
}

std::string alpaca_prompt(const std::string& instruction, const std::string& input) {
  if (input.empty())
    return "Below is an instruction that describes a task. Write a response that "
           "appropriately completes the request.\n\n### Instruction:\n" +
           instruction + "\n\n### Response:\n";
  return "Below is an instruction that describes a task, paired with an input that provides "
         "further context. Write a response that appropriately completes the request.\n\n"
         "### Instruction:\n" +
         instruction + "\n\n### Input:\n" + input + "\n\n### Response:\n";
}

}  // namespace frugal
