// The trial of a chat template in a fork()ed child (ckpt/isolated.h's run_isolated).
#include "train/chat_template_trial.h"

#include "ckpt/isolated.h"
#include "core/error.h"

namespace frugal {

void try_chat_template(const ChatTemplate& chat, std::span<const Conversation> samples,
                       double timeout_s) {
  using R = ChatRole;
  const std::vector<Conversation> probes = {
      {{R::user, "Hi."}},
      {{R::system, "Be brief."}, {R::user, "Hi."}},
      {{R::user, "Hi."}, {R::assistant, "Hello."}},
      {{R::system, "Be brief."}, {R::user, "Hi."}, {R::assistant, "Hello."}, {R::user, "Why?"},
       {R::assistant, "Because."}}};
  const auto render_all = [&] {
    for (const std::span<const Conversation> list : {std::span<const Conversation>(probes), samples})
      for (const Conversation& c : list)
        for (bool generation : {false, true}) {
          try {
            chat.render(c, generation);
          } catch (const Error&) {  // the template refused the conversation by name: fine here
          }
        }
    return std::string("ok");
  };
  const IsolatedOutcome outcome = run_isolated(render_all, timeout_s);
  if (outcome.ok) return;
  if (outcome.crashed || outcome.timed_out)
    fail("chat template ", chat.source(), " ", outcome.text,
         " while rendering a conversation in a child process (tried before rendering the data ",
         "here): the template loops without end or breaks the Jinja engine (unbounded ",
         "recursion, a division by zero); fix it, or give --chat-template FILE");
  fail("chat template ", chat.source(), ": ", outcome.text);
}

}  // namespace frugal
