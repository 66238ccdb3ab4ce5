// A chat template tried in a child process before it renders anything here: a template is a
// program from a model's files, and one that recurses without end or divides by zero crashes
// its Jinja engine (minja has no recursion or step limits), one that loops a billion times
// never ends. Tried on a few conversations of every shape and on the data's own first ones.
#pragma once

#include <span>

#include "data/chat_template.h"

namespace frugal {

// Renders `chat` (with and without the generation prompt) on probe conversations and on
// `samples` in a fork()ed child, within `timeout_s`. Throws Error naming the template when the
// child crashes or does not finish. What the template raises (raise_exception) is not a
// failure here: that is told by name where the data is rendered.
void try_chat_template(const ChatTemplate& chat, std::span<const Conversation> samples,
                       double timeout_s = 30);

}  // namespace frugal
