// A model's chat template: the Jinja program in its tokenizer_config.json (or
// chat_template.jinja) that turns a conversation into the text the model was trained on,
// rendered as transformers' apply_chat_template renders it (minja, a C++ Jinja engine: see
// doc/dependencies.md).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/conversation.h"

namespace frugal {

// The special tokens' strings a template sees (transformers' special_tokens_map); an empty
// one is not defined for the template.
struct TemplateTokens {
  std::string bos, eos, unk, pad;
};

class ChatTemplate {
 public:
  // Parses `text`; `source` names it in messages (a file, or a file and key). Throws Error
  // naming the source when the text is not a template minja can parse.
  ChatTemplate(const std::string& text, std::string source, TemplateTokens tokens);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // The text of `messages`, with the assistant's header after them when
  // `add_generation_prompt`. The template sees messages (role, content), add_generation_prompt,
  // tools and documents (none), the special tokens' strings, raise_exception and strftime_now,
  // with trim_blocks and lstrip_blocks as transformers sets them. Throws Error naming the source
  // when the template raises (its message) or fails. Thread-safe.
  std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

  const std::string& source() const { return source_; }
  const TemplateTokens& tokens() const { return tokens_; }
  const std::string& text() const { return text_; }

 private:
  struct Parsed;
  std::string text_;
  std::string source_;
  TemplateTokens tokens_;
  std::shared_ptr<const Parsed> parsed_;
};

// The chat template of the tokenizer at `tokenizer_path` (tokenizer.model or tokenizer.json),
// from the files beside it as transformers reads them: chat_template.jinja, else
// tokenizer_config.json's "chat_template" (a string, or the entry named "default" of a list
// of {"name", "template"}); the special tokens' strings from tokenizer_config.json, else the
// tokenizer's own bos and eos pieces (`bos_piece`, `eos_piece`). `template_file`, when given,
// replaces the template text (not the tokens). Nothing when there is no template. Throws Error
// naming the file for one that cannot be read or parsed.
std::optional<ChatTemplate> find_chat_template(const std::string& tokenizer_path,
                                               const std::string& template_file,
                                               const std::string& bos_piece,
                                               const std::string& eos_piece);

// The ids that end a reply: generation_config.json's "eos_token_id" beside the tokenizer at
// `tokenizer_path` (an id or a list: Llama 3.1 Instruct ends a turn with <|eot_id|> and a tool
// call with <|eom_id|>), and `eos_id` (when >= 0). Throws Error naming the file when it holds
// something else there.
std::vector<int32_t> reply_end_ids(const std::string& tokenizer_path, int32_t eos_id);

}  // namespace frugal
