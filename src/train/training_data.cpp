// The targets of a run's token files, the windows they are packed into, and what they come to.
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

struct WindowTargets {
  uint64_t windows = 0, empty_windows = 0, counted = 0, positions = 0;
};

// What the sampler's windows train. windows: window w's targets are tokens w seq + 1 ..
// (w + 1) seq of the stream; packed: each piece's targets (sampler.cpp's fill_packed_row).
WindowTargets count_window_targets(const TokenFile& file, const PackedWindows* packed, uint64_t seq,
                                   TrainedRoles trained) {
  WindowTargets w;
  const TokenRole* roles = file.roles();
  auto count = [&](uint64_t first, uint64_t n) {
    return roles ? count_trained(roles + first, n, trained) : n;
  };
  if (!packed) {
    for (uint64_t start = 0; start + seq < file.size(); start += seq, ++w.windows) {
      const uint64_t in_window = count(start + 1, seq);
      w.counted += in_window;
      w.empty_windows += in_window == 0;
    }
    w.positions = w.windows * seq;
    return w;
  }
  w.windows = uint64_t(packed->size());
  w.positions = w.windows * seq;
  for (int64_t i = 0; i < packed->size(); ++i) {
    uint64_t in_window = 0;
    for (const PackedPiece& piece : packed->window(i))
      in_window += count(piece.first + 1, piece.last_predicts ? piece.rows : piece.rows - 1);
    w.counted += in_window;
    w.empty_windows += in_window == 0;
  }
  return w;
}

std::unique_ptr<PackedWindows> pack(const TrainConfig& c, Packing packing, const TokenFile& file,
                                    const std::string& path) {
  if (packing == Packing::windows) return nullptr;
  return std::make_unique<PackedWindows>(file.document_starts(), c.train.seq_len, packing,
                                         c.data.long_documents, path);
}

void log_packing(const PackingCounts& n, Packing packing, int64_t seq) {
  char per_window[32];
  std::snprintf(per_window, sizeof per_window, "%.1f",
                n.windows ? double(n.pieces) / double(n.windows) : 0.0);
  log_info("data: data.packing = ", enum_name(packing), ": ", n.documents, " documents in ",
           n.windows, " windows of ", seq, " tokens (", per_window, " documents a window, ",
           percent(n.rows_used, n.windows * uint64_t(seq)),
           " of the rows filled; attention stays inside each document)");
  if (n.split > 0)
    log_info("data: ", n.split, " documents longer than a window (the longest has ",
             n.longest_document, " tokens) are split into pieces of ", seq,
             " tokens (data.long_documents = split); a piece does not see the ones before it");
  if (n.truncated > 0)
    log_warn("data: ", n.truncated, " documents longer than a window (the longest has ",
             n.longest_document, " tokens) are truncated to ", seq,
             " tokens (data.long_documents = truncate): ", n.dropped_tokens,
             " tokens are never trained on");
}

}  // namespace

TrainingData training_data(const TrainConfig& c, const TokenFile& train, const TokenFile& val,
                           int log_rank) {
  TrainingData data;
  const std::string train_path = (fs::path(c.data.dir) / "train.tok").string();
  const std::string val_path = (fs::path(c.data.dir) / "val.tok").string();
  if (train.header().content != val.header().content && val.size() > 0)
    fail("'", train_path, "' holds ", content_names(train.header().content), " data and '",
         val_path, "' ", content_names(val.header().content),
         ": prepare both from the same corpus with `frugal prepare`");
  const TrainedRoles trained = trained_roles(c.data.train_on, train.header().content, train_path);
  data.train_targets = {train.roles(), trained};
  data.val_targets = {val.roles(), trained};
  data.packing = resolved_packing(c.data.packing, train.header().content);
  data.train_windows = pack(c, data.packing, train, train_path);
  if (val.size() > 0) data.val_windows = pack(c, data.packing, val, val_path);

  const auto seq = static_cast<uint64_t>(c.train.seq_len);
  const WindowTargets w = count_window_targets(train, data.train_windows.get(), seq, trained);
  std::string mode(enum_name(c.data.train_on));
  if (c.data.train_on == TrainOn::automatic)
    mode += " (" +
            std::string(enum_name(resolved_train_on(c.data.train_on, train.header().content))) +
            ")";
  if (w.counted == 0)
    fail("data.train_on = ", mode, ": '", train_path, "' holds no token to train on in its ",
         w.windows, " windows of train.seq_len = ", seq, " (its ",
         content_names(train.header().content), " documents have no ",
         !train.roles()                               ? "second token"
         : trained == role_bit(TokenRole::last_reply) ? "last reply"
                                                      : "reply",
         " there); every target would be masked");
  if (log_rank != 0) return data;
  log_info("data: ", content_names(train.header().content), " data, data.train_on = ", mode, ": ",
           w.counted, " of the windows' ", w.positions, " positions trained (",
           percent(w.counted, w.positions), ")");
  if (w.empty_windows > 0)
    log_warn("data: ", w.empty_windows, " of ", w.windows, " windows of train.seq_len = ", seq,
             " hold no trained target (", percent(w.empty_windows, w.windows),
             "): they cost a forward and backward and teach nothing");
  if (data.train_windows) {
    log_packing(data.train_windows->counts(), data.packing, c.train.seq_len);
    return data;
  }
  uint64_t longer = 0, longest = 0;
  const std::span<const uint64_t> starts = train.document_starts();
  for (size_t d = 0; d + 1 < starts.size(); ++d) {
    const uint64_t length = starts[d + 1] - starts[d];
    longest = std::max(longest, length);
    if (length > seq + 1) ++longer;
  }
  if (longer > 0)
    log_info("data: ", longer, " of ", starts.size() - 1, " documents are longer than a window (",
             seq + 1, " tokens; the longest has ", longest,
             "): windows cut them, and their later windows do not see their start");
  return data;
}

}  // namespace frugal
