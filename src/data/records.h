// JSON records of instruction and chat data, as the tools users fine-tune with write them:
// OpenAI-style "messages", ShareGPT "conversations", Stanford Alpaca, prompt/completion pairs,
// and "text". Each becomes a CorpusDocument of its kind.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>

#include "core/enum_names.h"
#include "data/conversation.h"
#include "data/token_file.h"

namespace frugal {

enum class RecordFormat {
  messages,    // {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
  sharegpt,    // {"conversations": [{"from": "system" | "human" | "gpt", "value": "..."}, ...]}
  alpaca,      // {"instruction": "...", "input": "..." (optional), "output": "..."}
  completion,  // {"prompt": "...", "completion": "..."}
  text,        // {"text": "..."}
};
inline std::span<const EnumName<RecordFormat>> enum_names(RecordFormat) {
  static constexpr EnumName<RecordFormat> names[] = {{RecordFormat::messages, "messages"},
                                                     {RecordFormat::sharegpt, "sharegpt"},
                                                     {RecordFormat::alpaca, "alpaca"},
                                                     {RecordFormat::completion, "completion"},
                                                     {RecordFormat::text, "text"}};
  return names;
}

// One document of a corpus, of one of three kinds.
struct CorpusDocument {
  DocumentContent content = DocumentContent::text;
  std::string text;           // text: the document; instruction: the prompt
  std::string completion;     // instruction: what the model is to answer
  Conversation conversation;  // chat
  std::string where;          // "file", "file:line" or "file: record i", for messages

  // The text a tokenizer is trained on: the document, the prompt and its completion, or every
  // message's content.
  std::string plain_text() const;
  // plain_text().size(), without the copy.
  size_t plain_bytes() const;
};

// The format of a record, from its keys, in this order: "messages", "conversations",
// "prompt" + "completion", "instruction" + "output", "text"; nothing when it has none of them.
std::optional<RecordFormat> detect_record_format(const nlohmann::json& record);

// The document of `record` read as `format`. Throws Error "<where>: ..." naming what is wrong:
// not an object, a missing or non-string field, an unknown role (naming the roles there are),
// content that is not a string (multimodal parts), an empty assistant turn, an empty
// conversation.
CorpusDocument document_from_record(const nlohmann::json& record, RecordFormat format,
                                    const std::string& where);

// Stanford Alpaca's prompt template; the document of a record is the prompt followed by the
// output. `input` may be empty (the template without the "### Input:" section).
std::string alpaca_prompt(const std::string& instruction, const std::string& input);

}  // namespace frugal
