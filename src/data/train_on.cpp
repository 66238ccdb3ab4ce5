// Which roles data.train_on trains, per kind of data.
#include "data/train_on.h"

#include "core/error.h"

namespace frugal {

TrainedRoles trained_roles(TrainOn mode, uint32_t content, const std::string& file) {
  const bool text = content == content_bit(DocumentContent::text);
  const bool chat = (content & content_bit(DocumentContent::chat)) != 0;
  const bool instruction = (content & content_bit(DocumentContent::instruction)) != 0;
  const TrainedRoles replies = role_bit(TokenRole::reply) | role_bit(TokenRole::last_reply);
  const std::string holds = "'" + file + "' holds " + content_names(content) + " data";
  switch (mode) {
    case TrainOn::all:
      return kEveryRole;
    case TrainOn::automatic:
      return text ? kEveryRole : replies;
    case TrainOn::assistant:
    case TrainOn::last_turn:
      if (!chat)
        fail("data.train_on = ", enum_name(mode), " selects assistant turns, but ", holds,
             text ? ": nothing in it marks a prompt (use all)"
                  : " without conversations (use completion, or all)");
      return mode == TrainOn::assistant ? replies : role_bit(TokenRole::last_reply);
    case TrainOn::completion:
      if (!instruction)
        fail("data.train_on = completion selects the completions of instruction data, but ", holds,
             text ? ": nothing in it marks a prompt (use all)"
                  : " (use assistant or last_turn, or all)");
      return replies;
  }
  return kEveryRole;
}

TrainOn resolved_train_on(TrainOn mode, uint32_t content) {
  if (mode != TrainOn::automatic) return mode;
  if (content == content_bit(DocumentContent::text)) return TrainOn::all;
  if (content == content_bit(DocumentContent::chat)) return TrainOn::assistant;
  if (content == content_bit(DocumentContent::instruction)) return TrainOn::completion;
  return TrainOn::automatic;
}

uint64_t count_trained(const TokenRole* roles, uint64_t n, TrainedRoles trained) {
  if (!roles || trained == kEveryRole) return n;
  uint64_t count = 0;
  for (uint64_t i = 0; i < n; ++i) count += (trained >> uint8_t(roles[i])) & 1u;
  return count;
}

}  // namespace frugal
