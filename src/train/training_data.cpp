// The targets of a run's token files, and what they come to per window.
#include "train/training_data.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"

namespace frugal {

namespace fs = std::filesystem;

namespace {

std::string percent(uint64_t part, uint64_t whole) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %%", whole ? 100.0 * double(part) / double(whole) : 0.0);
  return text;
}

}  // namespace

TrainingTargets select_training_targets(const TrainConfig& c, const TokenFile& train,
                                        const TokenFile& val, int log_rank) {
  TrainingTargets targets;
  const std::string train_path = (fs::path(c.data.dir) / "train.tok").string();
  const std::string val_path = (fs::path(c.data.dir) / "val.tok").string();
  if (train.header().content != val.header().content && val.size() > 0)
    fail("'", train_path, "' holds ", content_names(train.header().content), " data and '",
         val_path, "' ", content_names(val.header().content),
         ": prepare both from the same corpus with `frugal prepare`");
  const TrainedRoles trained = trained_roles(c.data.train_on, train.header().content, train_path);
  targets.train = {train.roles(), trained};
  targets.val = {val.roles(), trained};
  if (!train.roles()) return targets;  // text: every target trains

  // The sampler's windows: window w's targets are tokens w seq + 1 .. (w + 1) seq of the
  // stream. One pass counts what they train and the windows that train nothing.
  const uint64_t n = train.size();
  const TokenRole* roles = train.roles();
  const auto seq = static_cast<uint64_t>(c.train.seq_len);
  uint64_t windows = 0, empty_windows = 0, counted = 0;
  for (uint64_t start = 0; start + seq < n; start += seq, ++windows) {
    const uint64_t in_window = count_trained(roles + start + 1, seq, trained);
    counted += in_window;
    empty_windows += in_window == 0;
  }
  std::string mode(enum_name(c.data.train_on));
  if (c.data.train_on == TrainOn::automatic)
    mode += " (" +
            std::string(enum_name(resolved_train_on(c.data.train_on, train.header().content))) +
            ")";
  if (counted == 0)
    fail("data.train_on = ", mode, ": '", train_path, "' holds no token to train on in its ",
         windows, " windows of train.seq_len = ", seq, " (its ",
         content_names(train.header().content), " documents have no ",
         trained == role_bit(TokenRole::last_reply) ? "last reply" : "reply",
         " there); every target would be masked");
  if (log_rank != 0) return targets;
  uint64_t longer = 0, longest = 0;
  const std::span<const uint64_t> starts = train.document_starts();
  for (size_t d = 0; d + 1 < starts.size(); ++d) {
    const uint64_t length = starts[d + 1] - starts[d];
    longest = std::max(longest, length);
    if (length > seq + 1) ++longer;
  }
  log_info("data: ", content_names(train.header().content), " data, data.train_on = ", mode, ": ",
           counted, " of the windows' ", windows * seq, " targets trained (",
           percent(counted, windows * seq), ")");
  if (empty_windows > 0)
    log_warn("data: ", empty_windows, " of ", windows, " windows of train.seq_len = ", seq,
             " hold no trained target (", percent(empty_windows, windows),
             "): they cost a forward and backward and teach nothing");
  if (longer > 0)
    log_info("data: ", longer, " of ", starts.size() - 1, " documents are longer than a window (",
             seq + 1, " tokens; the longest has ", longest,
             "): windows cut them, and their later windows do not see their start");
  return targets;
}

}  // namespace frugal
