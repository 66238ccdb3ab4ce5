// Training windows from a token stream: a seeded, resumable, rank-aware batch sampler for
// training, and a sequential iterator over every window of a validation file.
//
// Two kinds of window (data.packing, data/packing.h):
// - windows: seq_len + 1 consecutive tokens starting at a multiple of seq_len (windows overlap
//   by the one token that is both the last target of a window and the first input of the next):
//   inputs = window[0, seq_len), targets = window[1, seq_len + 1). Windows cross document
//   boundaries, and so do targets: after a document's eos comes the next document's bos, then
//   its first token (this is how llm.c and GPT-2 pack text; attention also runs across).
// - documents, pad: the windows of a PackedWindows, whole documents (or pieces of long ones)
//   back to back, padded at the end; each row carries its document's bounds, so that
//   attention stays inside it and positions restart with it.
//
// Choices:
// - A target of -1 marks a position the loss ignores: a token whose role (instruction and chat
//   data, data/token_file.h) the run does not train on (data.train_on, TargetSelection), and in
//   evaluation the padding of the last, partial window and of the rows past the end of the
//   data (input 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/stateful.h"
#include "core/tensor.h"
#include "data/packing.h"
#include "data/token_file.h"
#include "data/train_on.h"

namespace frugal {

// Target of a position the loss must ignore.
constexpr int32_t kIgnoreTarget = -1;

struct TokenBatch {
  Tensor inputs;   // [micro_batch_size, seq_len] i32 token ids
  Tensor targets;  // [micro_batch_size, seq_len] i32 next-token ids, kIgnoreTarget = masked
  int64_t target_tokens = 0;  // targets that are not kIgnoreTarget
  // Packed documents (PackedWindows): [micro_batch_size, seq_len] i32, the window row where each
  // token's document (or piece) begins and one past where it ends; padding rows are documents
  // of one row. Undefined for data.packing = windows.
  Tensor document_start, document_end;
  int64_t documents = 0;  // documents and pieces in the rows (padding not counted)
};

// Which targets the loss counts: those whose token has a role in `trained` (every target when
// `roles` is null, as for text).
struct TargetSelection {
  const TokenRole* roles = nullptr;  // one per token of the stream, or null
  TrainedRoles trained = kEveryRole;
};

// Where the sampler is: `position` global rows of epoch `epoch`'s order have been handed
// out. Identical on every rank; saved in checkpoints.
struct SamplerState {
  uint64_t epoch = 0;
  uint64_t position = 0;
  bool operator==(const SamplerState&) const = default;
};

struct SamplerConfig {
  int64_t seq_len = 256;
  int64_t micro_batch_size = 8;  // rows per rank
  uint64_t seed = 0;
  int rank = 0;   // this rank's index in the data-parallel group
  int world = 1;  // data-parallel ranks
};

// Hands out batches of training windows in a seeded random order.
//
// Each epoch visits every window once, in the order of a Fisher-Yates permutation seeded by
// (seed, epoch). The epochs' orders are laid end to end and cut into global batches of
// world * micro_batch_size rows, so no window is ever dropped and a global batch may span
// two epochs. Rank r takes rows [r * B, (r + 1) * B) of every global batch: the ranks'
// batches are disjoint and together are exactly the global batch a single rank with
// micro_batch_size = world * B would see. next() depends only on (config, state), so
// restore(state()) resumes bit-identically, in this process or another.
//
// The sampler views the tokens; they (e.g. the TokenFile) must outlive it.
class BatchSampler : public Stateful {
 public:
  // Throws Error when the stream holds fewer than seq_len + 1 tokens (not one window), or
  // for a bad config, naming the values. (A global batch larger than an epoch is allowed.)
  // With `packed` (built for config.seq_len over the same tokens; it must outlive the sampler)
  // its windows are those handed out.
  BatchSampler(TokenView tokens, const SamplerConfig& config, TargetSelection targets = {},
               const PackedWindows* packed = nullptr);

  TokenBatch next();

  SamplerState state() const { return state_; }
  void restore(const SamplerState& state);
  // The state in checkpoints: {"epoch": ..., "position": ...}.
  nlohmann::json state_values() const override;
  // Refuses a state saved with other windows (data.packing, their number), naming both.
  void load_state_values(const nlohmann::json& values) override;

  const SamplerConfig& config() const { return config_; }
  int64_t windows_per_epoch() const { return num_windows_; }
  // Global batches in one epoch's worth of windows (fractional: batches may span epochs).
  double batches_per_epoch() const;

 private:
  const std::vector<int64_t>& order_of(uint64_t epoch);
  std::string packing_name() const;

  TokenView tokens_;
  SamplerConfig config_;
  TargetSelection targets_;
  const PackedWindows* packed_ = nullptr;
  int64_t num_windows_ = 0;
  SamplerState state_;
  // The window orders of the last two epochs asked for (a batch may span two).
  struct CachedOrder {
    uint64_t epoch = UINT64_MAX;
    std::vector<int64_t> order;
  };
  CachedOrder cache_[2];
  int cache_next_ = 0;  // the slot to overwrite next
};

// Every window of a stream in order, for evaluation: window k starts at token k * seq_len;
// the last window may be partial (padded). Batches hold world * micro_batch_size windows,
// rank r taking rows [r * B, (r + 1) * B); rows past the end are all padding, so every rank
// sees the same number of batches (needed for collective loss sums).
class EvalIterator {
 public:
  // max_batches <= 0: all batches.
  // With `packed`, its windows in order instead (all of them whole: none is partial).
  EvalIterator(TokenView tokens, int64_t seq_len, int64_t micro_batch_size, int rank = 0,
               int world = 1, int64_t max_batches = 0, TargetSelection targets = {},
               const PackedWindows* packed = nullptr);

  // Fills `batch` and returns true, or returns false at the end.
  bool next(TokenBatch& batch);
  void reset() { batch_index_ = 0; }
  int64_t num_batches() const { return num_batches_; }
  int64_t num_windows() const { return num_windows_; }

 private:
  TokenView tokens_;
  TargetSelection targets_;
  const PackedWindows* packed_ = nullptr;
  int64_t seq_len_;
  int64_t micro_batch_size_;
  int rank_;
  int world_;
  int64_t num_windows_ = 0;
  int64_t num_batches_ = 0;
  int64_t batch_index_ = 0;
};

}  // namespace frugal
