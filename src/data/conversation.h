// A conversation as chat data holds it: messages of a system, a user and an assistant, in the
// order they were said.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/enum_names.h"

namespace frugal {

enum class ChatRole { system, user, assistant };
inline std::span<const EnumName<ChatRole>> enum_names(ChatRole) {
  static constexpr EnumName<ChatRole> names[] = {
      {ChatRole::system, "system"}, {ChatRole::user, "user"}, {ChatRole::assistant, "assistant"}};
  return names;
}

struct ChatMessage {
  ChatRole role = ChatRole::user;
  std::string content;
};

using Conversation = std::vector<ChatMessage>;

}  // namespace frugal
