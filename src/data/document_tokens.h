// A document of the corpus as the ids and roles a token file stores: text as bos, ids, eos; an
// instruction as bos, prompt and completion, eos, the completion's tokens its reply; a
// conversation as its chat template renders it, each assistant turn's tokens a reply.
//
// Which tokens are a reply is decided by the structure of the document, never by looking for
// markers in the text: a completion is what follows its prompt; an assistant turn is what the
// template adds when the conversation goes on past the generation prompt, i.e. the text between
// render(messages[:k], add_generation_prompt) and render(messages[:k+1]) (the turn's content,
// its end-of-turn token and whatever the template writes after it). A token is a reply when
// any byte it stands for lies in such a span, as transformers' return_assistant_tokens_mask
// decides (a token across the border counts as the reply's).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "data/chat_template.h"
#include "data/records.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace frugal {

class DocumentEncoder {
 public:
  // `chat_template` may be null when no document is a conversation.
  DocumentEncoder(const Tokenizer& tokenizer, const ChatTemplate* chat_template);

  // Throws Error naming doc.where: a conversation without a template, a template that raises
  // or that renders a conversation's first messages other than as the start of the whole (so
  // that its turns cannot be told apart), a document that encodes to no token. Thread-safe.
  // `progress`, when given, hears of the bytes of text encoded (plain_bytes()), a long text's
  // piece by piece (Tokenizer::encode_long).
  TokenizedDocument encode(const CorpusDocument& doc,
                           const std::function<void(int64_t)>& progress = nullptr) const;

 private:
  TokenizedDocument encode_text(const CorpusDocument& doc,
                                const std::function<void(int64_t)>& progress) const;
  TokenizedDocument encode_instruction(const CorpusDocument& doc) const;
  TokenizedDocument encode_chat(const CorpusDocument& doc) const;

  const Tokenizer& tokenizer_;
  const ChatTemplate* chat_template_;
};

}  // namespace frugal
