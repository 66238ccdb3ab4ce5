// Documents to ids and roles: the spans of the replies from the template's structure, then the
// tokens that touch them.
#include "data/document_tokens.h"

#include "core/error.h"

namespace frugal {

namespace {

struct ByteSpan {
  size_t begin, end;
};

// The role of each token of `tokens`: last_reply where it touches the last span, reply where
// it touches another, else prompt. A token that stands for no byte (SentencePiece's prefix
// space) counts as touching a span it lies in.
std::vector<TokenRole> roles_of(const TokenSpans& tokens, const std::vector<ByteSpan>& replies) {
  std::vector<TokenRole> roles(tokens.ids.size(), TokenRole::prompt);
  for (size_t r = 0; r < replies.size(); ++r) {
    const ByteSpan s = replies[r];
    const TokenRole role = r + 1 == replies.size() ? TokenRole::last_reply : TokenRole::reply;
    for (size_t i = 0; i < roles.size(); ++i) {
      const size_t b = tokens.begin[i], e = tokens.end[i];
      const bool touches = b == e ? (s.begin <= b && b < s.end) : (b < s.end && e > s.begin);
      if (touches) roles[i] = role;
    }
  }
  return roles;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

DocumentEncoder::DocumentEncoder(const Tokenizer& tokenizer, const ChatTemplate* chat_template)
    : tokenizer_(tokenizer), chat_template_(chat_template) {}

TokenizedDocument DocumentEncoder::encode(const CorpusDocument& doc,
                                          const std::function<void(int64_t)>& progress) const {
  if (doc.content == DocumentContent::text) return encode_text(doc, progress);
  TokenizedDocument out =
      doc.content == DocumentContent::instruction ? encode_instruction(doc) : encode_chat(doc);
  if (progress) progress(int64_t(doc.plain_bytes()));
  return out;
}

TokenizedDocument DocumentEncoder::encode_text(const CorpusDocument& doc,
                                               const std::function<void(int64_t)>& progress) const {
  TokenizedDocument out;
  if (tokenizer_.bos_id() >= 0) out.ids.push_back(tokenizer_.bos_id());
  const std::vector<int32_t> ids = tokenizer_.encode_long(doc.text, progress);
  out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  out.ids.push_back(tokenizer_.eos_id());
  return out;
}

// As TRL's SFTTrainer tokenizes a prompt/completion pair: the tokenizer's own bos (where it
// adds one), prompt + completion as one text, eos; the tokens of the completion and the eos
// are the reply.
TokenizedDocument DocumentEncoder::encode_instruction(const CorpusDocument& doc) const {
  TokenizedDocument out;
  out.content = DocumentContent::instruction;
  if (tokenizer_.prepends_bos() && tokenizer_.bos_id() >= 0) {
    out.ids.push_back(tokenizer_.bos_id());
    out.roles.push_back(TokenRole::prompt);
  }
  const std::string text = doc.text + doc.completion;
  const TokenSpans tokens = tokenizer_.encode_template_output(text);
  const std::vector<TokenRole> roles = roles_of(tokens, {{doc.text.size(), text.size()}});
  out.ids.insert(out.ids.end(), tokens.ids.begin(), tokens.ids.end());
  out.roles.insert(out.roles.end(), roles.begin(), roles.end());
  out.ids.push_back(tokenizer_.eos_id());
  out.roles.push_back(TokenRole::last_reply);
  return out;
}

TokenizedDocument DocumentEncoder::encode_chat(const CorpusDocument& doc) const {
  if (!chat_template_)
    fail(doc.where, ": a conversation, and no chat template to render it with: prepare chat ",
         "data with a model's tokenizer that has one (--tokenizer), or give --chat-template FILE");
  const Conversation& messages = doc.conversation;
  const ChatTemplate& chat = *chat_template_;
  std::string whole;
  try {
    whole = chat.render(messages, /*add_generation_prompt=*/false);
  } catch (const Error& e) {
    fail(doc.where, ": ", e.what());
  }
  std::vector<ByteSpan> replies;
  for (size_t k = 0; k < messages.size(); ++k) {
    if (messages[k].role != ChatRole::assistant) continue;
    if (k == 0)
      fail(doc.where, ": the conversation starts with an assistant turn: nothing renders before ",
           "it to tell the turn from the template's preamble (start with the system or the ",
           "user's message)");
    const std::span<const ChatMessage> before(messages.data(), k), through(messages.data(), k + 1);
    std::string prompt, turn;
    try {
      prompt = chat.render(before, /*add_generation_prompt=*/true);
      turn = k + 1 == messages.size() ? whole : chat.render(through, false);
    } catch (const Error& e) {
      fail(doc.where, ": rendering the conversation up to message ", k, ": ", e.what());
    }
    if (!starts_with(turn, prompt) || !starts_with(whole, turn) || turn.size() == prompt.size())
      fail(doc.where, ": chat template ", chat.source(), " renders the messages before ",
           "assistant turn ", k, " (with the generation prompt) or up to it as text that is not ",
           "how the whole conversation starts, or adds nothing for the turn: its turns cannot be ",
           "told apart by rendering (templates that rewrite earlier turns, as some reasoning ",
           "models' do, cannot be trained per turn)");
    replies.push_back({prompt.size(), turn.size()});
  }
  TokenSpans tokens = tokenizer_.encode_template_output(whole);
  if (tokens.ids.empty()) fail(doc.where, ": the rendered conversation has no token");
  TokenizedDocument out;
  out.content = DocumentContent::chat;
  out.roles = roles_of(tokens, replies);
  out.ids = std::move(tokens.ids);
  return out;
}

}  // namespace frugal
