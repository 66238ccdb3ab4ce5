// data.train_on: which tokens of instruction and chat documents the loss learns from, chosen
// by the role each token was given when the data was prepared (data/token_file.h), never by
// what the text says.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/enum_names.h"
#include "data/token_file.h"

namespace frugal {

enum class TrainOn {
  automatic,   // assistant for chat data, completion for instruction data, all for text
  all,         // every token, prompts included
  assistant,   // chat: every assistant turn
  last_turn,   // chat: the last assistant turn of each conversation
  completion,  // instruction: the completion (the reply to the prompt)
};
inline std::span<const EnumName<TrainOn>> enum_names(TrainOn) {
  static constexpr EnumName<TrainOn> names[] = {{TrainOn::automatic, "auto"},
                                                {TrainOn::all, "all"},
                                                {TrainOn::assistant, "assistant"},
                                                {TrainOn::last_turn, "last_turn"},
                                                {TrainOn::completion, "completion"}};
  return names;
}

// The roles a mode trains: bit r set when TokenRole r is a target the loss counts.
using TrainedRoles = uint8_t;
constexpr TrainedRoles kEveryRole = (1u << kTokenRoles) - 1;
constexpr TrainedRoles role_bit(TokenRole role) { return TrainedRoles(1u << uint8_t(role)); }

// The roles `mode` trains in a file of `content` (TokenFileHeader::content). Throws Error,
// naming `file`, when the mode does not apply to what the file holds (assistant turns in
// instruction data, a completion in chat data, anything but all in plain text).
TrainedRoles trained_roles(TrainOn mode, uint32_t content, const std::string& file);

// What auto stands for in a file of `content`: assistant for chat, completion for instruction
// data, all for text (auto itself for instruction and chat together, where it trains the replies
// of both); any other mode is itself.
TrainOn resolved_train_on(TrainOn mode, uint32_t content);

// The number of tokens of `roles` (n of them) whose role `trained` selects.
uint64_t count_trained(const TokenRole* roles, uint64_t n, TrainedRoles trained);

}  // namespace frugal
