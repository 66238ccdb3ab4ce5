// The seeded training sampler and the sequential evaluation iterator.
#include "data/sampler.h"

#include <algorithm>

#include "core/checked.h"
#include "core/error.h"
#include "core/json_integer.h"
#include "data/shuffle.h"

namespace frugal {

namespace {

TokenBatch allocate_batch(int64_t rows, int64_t seq_len, bool packed) {
  TokenBatch batch;
  batch.inputs = Tensor::empty({rows, seq_len}, DType::i32);
  batch.targets = Tensor::empty({rows, seq_len}, DType::i32);
  if (packed) {
    batch.document_start = Tensor::empty({rows, seq_len}, DType::i32);
    batch.document_end = Tensor::empty({rows, seq_len}, DType::i32);
  }
  return batch;
}

// Whether target token `index` of the stream is one the loss counts.
bool trained(const TargetSelection& selection, uint64_t index) {
  if (!selection.roles || selection.trained == kEveryRole) return true;
  return (selection.trained >> uint8_t(selection.roles[index])) & 1u;
}

// Writes packed window `pieces` into one row of seq_len (packing.h): each piece's tokens, their
// targets (the next token of the piece, none after its last unless it predicts), its bounds;
// then padding rows (input 0, no target, each its own one-row document). Returns the counted
// targets.
int64_t fill_packed_row(const TokenView& tokens, const TargetSelection& selection,
                        std::span<const PackedPiece> pieces, int64_t seq_len, int32_t* inputs,
                        int32_t* targets, int32_t* start, int32_t* end) {
  int64_t at = 0, counted = 0;
  for (const PackedPiece& piece : pieces) {
    const int64_t rows = piece.rows;
    tokens.copy(piece.first, uint64_t(rows), inputs + at);
    const int64_t predicting = piece.last_predicts ? rows : rows - 1;
    for (int64_t t = 0; t < rows; ++t) {
      start[at + t] = int32_t(at);
      end[at + t] = int32_t(at + rows);
      const uint64_t target = piece.first + uint64_t(t) + 1;
      if (t < predicting && trained(selection, target)) {
        targets[at + t] = tokens[target];
        ++counted;
      } else {
        targets[at + t] = kIgnoreTarget;
      }
    }
    at += rows;
  }
  for (int64_t t = at; t < seq_len; ++t) {
    inputs[t] = 0;
    targets[t] = kIgnoreTarget;
    start[t] = int32_t(t);
    end[t] = int32_t(t + 1);
  }
  return counted;
}

// Writes the window starting at token `start` into row `row`: inputs are tokens
// [start, start + seq_len), targets [start + 1, start + seq_len + 1); positions past the end
// of the stream, and targets whose role is not trained, get target kIgnoreTarget (and input 0
// past the end). Returns the number of counted targets.
int64_t fill_row(const TokenView& tokens, const TargetSelection& selection, int64_t start,
                 int64_t seq_len, int32_t* inputs, int32_t* targets) {
  const auto n = static_cast<int64_t>(tokens.size);
  const int64_t real_inputs = std::clamp<int64_t>(n - start, 0, seq_len);
  const int64_t real_targets = std::clamp<int64_t>(n - 1 - start, 0, seq_len);
  if (real_inputs > 0)
    tokens.copy(static_cast<uint64_t>(start), static_cast<uint64_t>(real_inputs), inputs);
  std::fill(inputs + real_inputs, inputs + seq_len, 0);
  if (real_targets > 0)
    tokens.copy(static_cast<uint64_t>(start + 1), static_cast<uint64_t>(real_targets), targets);
  std::fill(targets + real_targets, targets + seq_len, kIgnoreTarget);
  if (!selection.roles || selection.trained == kEveryRole) return real_targets;
  int64_t counted = 0;
  const TokenRole* roles = selection.roles + start + 1;  // the targets' roles
  for (int64_t j = 0; j < real_targets; ++j) {
    if ((selection.trained >> uint8_t(roles[j])) & 1u)
      ++counted;
    else
      targets[j] = kIgnoreTarget;
  }
  return counted;
}

// A batch of [micro_batch_size, seq_len] ids must have a size: a huge micro_batch_size would
// otherwise wrap around into a small allocation, or into a nonsense count of windows.
void check_batch_size(const char* who, int64_t micro_batch_size, int64_t seq_len) {
  try {
    shape_bytes({micro_batch_size, seq_len}, DType::i32);
  } catch (const Error& e) {
    fail(who, ": a batch of micro_batch_size ", micro_batch_size, " x seq_len ", seq_len,
         " token ids is too large: ", e.what());
  }
}

}  // namespace

// --- BatchSampler -----------------------------------------------------------------------

BatchSampler::BatchSampler(TokenView tokens, const SamplerConfig& config, TargetSelection targets,
                           const PackedWindows* packed)
    : tokens_(tokens), config_(config), targets_(targets), packed_(packed) {
  if (config.seq_len < 1) fail("sampler: seq_len ", config.seq_len, " must be at least 1");
  if (config.micro_batch_size < 1)
    fail("sampler: micro_batch_size ", config.micro_batch_size, " must be at least 1");
  if (config.world < 1 || config.rank < 0 || config.rank >= config.world)
    fail("sampler: rank ", config.rank, " is not in [0, world = ", config.world, ")");
  check_batch_size("sampler", config.micro_batch_size, config.seq_len);
  checked_mul(int64_t{config.world}, config.micro_batch_size,
              "sampler: data-parallel ranks x micro_batch_size");
  if (packed) {
    FRUGAL_CHECK(packed->seq_len() == config.seq_len, "sampler: windows packed for seq_len ",
                 packed->seq_len(), " sampled with seq_len ", config.seq_len);
    num_windows_ = packed->size();
    if (num_windows_ < 1) fail("the training data holds no document to pack into a window");
    return;
  }
  const auto n = static_cast<int64_t>(tokens.size);
  if (n <= config.seq_len)
    fail("the training data holds ", n, " tokens, fewer than one window of seq_len (",
         config.seq_len, ") + 1; use more text or a shorter seq_len");
  num_windows_ = (n - 1) / config.seq_len;
}

double BatchSampler::batches_per_epoch() const {
  return double(num_windows_) / double(config_.world * config_.micro_batch_size);
}

const std::vector<int64_t>& BatchSampler::order_of(uint64_t epoch) {
  for (const CachedOrder& cached : cache_)
    if (cached.epoch == epoch) return cached.order;
  CachedOrder& slot = cache_[cache_next_];
  cache_next_ = 1 - cache_next_;
  slot.epoch = epoch;
  slot.order = seeded_permutation(num_windows_, config_.seed, epoch);
  return slot.order;
}

TokenBatch BatchSampler::next() {
  const int64_t rows = config_.micro_batch_size;
  const int64_t seq_len = config_.seq_len;
  const auto windows = static_cast<uint64_t>(num_windows_);
  TokenBatch batch = allocate_batch(rows, seq_len, packed_ != nullptr);
  int32_t* inputs = batch.inputs.data<int32_t>();
  int32_t* targets = batch.targets.data<int32_t>();
  for (int64_t i = 0; i < rows; ++i) {
    // This rank's row i is global row rank * B + i of the batch that starts at `position`.
    const uint64_t index = state_.position + static_cast<uint64_t>(config_.rank * rows + i);
    const uint64_t epoch = state_.epoch + index / windows;
    const int64_t window = order_of(epoch)[index % windows];
    if (packed_) {
      const std::span<const PackedPiece> pieces = packed_->window(window);
      batch.target_tokens +=
          fill_packed_row(tokens_, targets_, pieces, seq_len, inputs + i * seq_len,
                          targets + i * seq_len, batch.document_start.data<int32_t>() + i * seq_len,
                          batch.document_end.data<int32_t>() + i * seq_len);
      batch.documents += int64_t(pieces.size());
      continue;
    }
    batch.target_tokens += fill_row(tokens_, targets_, window * seq_len, seq_len,
                                    inputs + i * seq_len, targets + i * seq_len);
  }
  const uint64_t advanced = state_.position + static_cast<uint64_t>(config_.world * rows);
  state_.epoch += advanced / windows;
  state_.position = advanced % windows;
  return batch;
}

void BatchSampler::restore(const SamplerState& state) {
  if (state.position >= static_cast<uint64_t>(num_windows_))
    fail("sampler state position ", state.position, " is past the ", num_windows_,
         " windows of an epoch: the checkpoint was made with other data or another seq_len");
  state_ = state;
}

// What the windows are, saved beside the state so that a resumed run with other windows (another
// data.packing, data, seq_len or data.long_documents) is refused instead of reading other batches.
std::string BatchSampler::packing_name() const {
  return std::string(enum_name(packed_ ? packed_->mode() : Packing::windows));
}

nlohmann::json BatchSampler::state_values() const {
  return {{"epoch", state_.epoch},
          {"position", state_.position},
          {"packing", packing_name()},
          {"windows", num_windows_}};
}

void BatchSampler::load_state_values(const nlohmann::json& values) {
  // Checkpoints from before packing have neither: their windows were the stride's.
  const std::string saved_packing = values.contains("packing") && values.at("packing").is_string()
                                        ? values.at("packing").get<std::string>()
                                        : std::string(enum_name(Packing::windows));
  if (saved_packing != packing_name())
    fail("the checkpoint's batches were windows of data.packing = ", saved_packing,
         ", this run's are ", packing_name(), ": resume with --data.packing=", saved_packing,
         ", or start a new run in another train.out_dir");
  if (values.contains("windows")) {
    const int64_t saved = json_integer(values.at("windows"), "sampler state 'windows'", 0);
    if (saved != num_windows_)
      fail("the checkpoint's sampler drew from ", saved,
           " windows an epoch, this run's data makes ", num_windows_,
           " (other data, another train.seq_len or data.long_documents): resume "
           "with the settings and data it was made with, or start a new run");
  }
  SamplerState state;
  state.epoch = uint64_t(json_integer(values.at("epoch"), "sampler state 'epoch'", 0));
  state.position = uint64_t(json_integer(values.at("position"), "sampler state 'position'", 0));
  restore(state);
}

// --- EvalIterator -----------------------------------------------------------------------

EvalIterator::EvalIterator(TokenView tokens, int64_t seq_len, int64_t micro_batch_size, int rank,
                           int world, int64_t max_batches, TargetSelection targets,
                           const PackedWindows* packed)
    : tokens_(tokens),
      targets_(targets),
      packed_(packed),
      seq_len_(seq_len),
      micro_batch_size_(micro_batch_size),
      rank_(rank),
      world_(world) {
  if (seq_len < 1) fail("eval: seq_len ", seq_len, " must be at least 1");
  if (micro_batch_size < 1)
    fail("eval: micro_batch_size ", micro_batch_size, " must be at least 1");
  if (world < 1 || rank < 0 || rank >= world)
    fail("eval: rank ", rank, " is not in [0, world = ", world, ")");
  check_batch_size("eval", micro_batch_size, seq_len);
  const auto n = static_cast<int64_t>(tokens.size);
  // Windows with at least one target: starts 0, S, 2S, ... below n - 1.
  num_windows_ = n <= 1 ? 0 : (n - 2) / seq_len + 1;
  if (packed) {
    FRUGAL_CHECK(packed->seq_len() == seq_len, "eval: windows packed for seq_len ",
                 packed->seq_len(), " read with seq_len ", seq_len);
    num_windows_ = packed->size();
  }
  const int64_t global_rows =
      checked_mul(int64_t{world}, micro_batch_size, "eval: data-parallel ranks x micro_batch_size");
  num_batches_ = (num_windows_ + global_rows - 1) / global_rows;
  if (max_batches > 0) num_batches_ = std::min(num_batches_, max_batches);
}

bool EvalIterator::next(TokenBatch& batch) {
  if (batch_index_ >= num_batches_) return false;
  batch = allocate_batch(micro_batch_size_, seq_len_, packed_ != nullptr);
  int32_t* inputs = batch.inputs.data<int32_t>();
  int32_t* targets = batch.targets.data<int32_t>();
  const int64_t first =
      (batch_index_ * world_ + rank_) * micro_batch_size_;  // global window of row 0
  for (int64_t i = 0; i < micro_batch_size_; ++i) {
    int32_t* row_inputs = inputs + i * seq_len_;
    int32_t* row_targets = targets + i * seq_len_;
    const int64_t window = first + i;
    if (packed_) {
      // Past the end: no piece, so the whole row is padding.
      const std::span<const PackedPiece> pieces =
          window < num_windows_ ? packed_->window(window) : std::span<const PackedPiece>{};
      batch.target_tokens +=
          fill_packed_row(tokens_, targets_, pieces, seq_len_, row_inputs, row_targets,
                          batch.document_start.data<int32_t>() + i * seq_len_,
                          batch.document_end.data<int32_t>() + i * seq_len_);
      batch.documents += int64_t(pieces.size());
    } else if (window < num_windows_) {
      batch.target_tokens +=
          fill_row(tokens_, targets_, window * seq_len_, seq_len_, row_inputs, row_targets);
    } else {
      std::fill(row_inputs, row_inputs + seq_len_, 0);
      std::fill(row_targets, row_targets + seq_len_, kIgnoreTarget);
    }
  }
  ++batch_index_;
  return true;
}

}  // namespace frugal
