// data.packing: how the documents of a token file become the rows of training windows.
//
//   windows    the stream cut every seq_len tokens, documents and all (llm.c, GPT-2): a window
//              crosses document boundaries and attention runs across them
//   documents  whole documents packed into windows (best-fit decreasing); attention stays inside
//              each, rotary positions restart at each document's start, and a document's last
//              token predicts nothing (the next document's first token is not its target)
//   pad        one document per window, the rest padding (what "unpacked" means)
//   auto       documents for instruction and chat data, windows for plain text
//
// Boundaries come from the document starts `frugal prepare` records in the token file, never from
// an end-of-sequence id (ChatML's <|im_end|> ends every turn, not the conversation).
//
// A document of n tokens takes n rows: row t reads token t and predicts token t + 1, its last row
// predicts nothing. One longer than a window (n > seq_len) is split into pieces of seq_len rows
// (each but the last predicting the next piece's first token at its last row; each piece
// attends only within itself, positions from 0) or truncated to its first seq_len rows
// (data.long_documents).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/enum_names.h"
#include "data/token_file.h"

namespace frugal {

enum class Packing { automatic, documents, windows, pad };
inline std::span<const EnumName<Packing>> enum_names(Packing) {
  static constexpr EnumName<Packing> names[] = {{Packing::automatic, "auto"},
                                                {Packing::documents, "documents"},
                                                {Packing::windows, "windows"},
                                                {Packing::pad, "pad"}};
  return names;
}

enum class LongDocuments { split, truncate };
inline std::span<const EnumName<LongDocuments>> enum_names(LongDocuments) {
  static constexpr EnumName<LongDocuments> names[] = {{LongDocuments::split, "split"},
                                                      {LongDocuments::truncate, "truncate"}};
  return names;
}

// What auto stands for in a file of `content` (TokenFileHeader::content bits): documents when it
// holds instruction or chat data, windows for plain text; any other mode is itself.
Packing resolved_packing(Packing mode, uint32_t content);

// Rows of one window taken by one document (or a piece of one): inputs are tokens
// [first, first + rows) of the stream; row t's target is token first + t + 1, except the last
// row's when `last_predicts` is false (the document's end).
struct PackedPiece {
  uint64_t first = 0;
  uint32_t rows = 0;
  bool last_predicts = false;
};

// What packing did, for the log and metrics.
struct PackingCounts {
  uint64_t documents = 0;         // documents of the file
  uint64_t split = 0;             // documents longer than a window, cut into pieces
  uint64_t truncated = 0;         // documents longer than a window, cut to one
  uint64_t dropped_tokens = 0;    // tokens truncation left out
  uint64_t pieces = 0;            // documents and pieces of documents placed
  uint64_t windows = 0;           // windows they fill
  uint64_t rows_used = 0;         // rows holding a token (the rest is padding)
  uint64_t longest_document = 0;  // tokens
};

// The windows of a token file under packing `documents` or `pad` (not windows: that is the
// sampler's own stride). Deterministic: the same file and settings give the same windows, so a
// resumed run's sampler state means the same windows.
class PackedWindows {
 public:
  // `document_starts`: TokenFile::document_starts() (each document's first token, then the
  // number of tokens). Throws Error, naming `file`, for seq_len < 1, a mode other than documents
  // or pad, or no document starts (a version 1 token file: prepare it again).
  PackedWindows(std::span<const uint64_t> document_starts, int64_t seq_len, Packing mode,
                LongDocuments long_docs, const std::string& file);

  int64_t size() const { return static_cast<int64_t>(window_first_.size()) - 1; }
  int64_t seq_len() const { return seq_len_; }
  Packing mode() const { return mode_; }
  std::span<const PackedPiece> window(int64_t w) const {
    return {pieces_.data() + window_first_[w],
            static_cast<size_t>(window_first_[w + 1] - window_first_[w])};
  }
  const PackingCounts& counts() const { return counts_; }

 private:
  int64_t seq_len_ = 0;
  Packing mode_ = Packing::documents;
  std::vector<PackedPiece> pieces_;     // window by window
  std::vector<uint64_t> window_first_;  // index of each window's first piece, then pieces_.size()
  PackingCounts counts_;
};

// Share (0..1) of the 128 x 128 tiles of causal attention over one window that its documents
// leave wholly masked: the work the kernels skip against a full causal window. `document_start`:
// for each row of the window, the row where its document begins (TokenBatch::document_start).
double skipped_attention_tiles(std::span<const int32_t> document_start);

}  // namespace frugal
