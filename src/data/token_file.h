// Token files (.tok): a 64-byte header and the token ids of every document, concatenated,
// each document written as  bos, ids..., eos  (ids..., eos  for a tokenizer without bos, such as
// Qwen2's: bos_id is then -1).  Written by `frugal prepare`, read (mmap) by
// training and evaluation.
//
// Layout, little-endian:
//   offset  0  char[8]  magic "FRUGTOK1"
//           8  uint32   version (1)
//          12  uint32   token_bytes: 2 (uint16 ids, vocab <= 65536) or 4 (uint32 ids)
//          16  uint64   num_tokens
//          24  uint64   num_documents
//          32  uint32   vocab_size
//          36  int32    bos_id (-1: none; documents are ids..., eos)
//          40  int32    eos_id
//          44  uint32   header_bytes (64)
//          48  16 bytes reserved, zero
//          64  num_tokens ids of token_bytes each
//
// Why both bos and eos: generation starts from bos (the model has seen what a document's
// first token looks like after it) and stops at eos (the model has learnt to end one). Without
// a bos, eos alone separates documents: what precedes every document but the first.
// Two ids per document is a few percent of a fortune, nothing of a book.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace frugal {

constexpr char kTokenFileMagic[8] = {'F', 'R', 'U', 'G', 'T', 'O', 'K', '1'};
constexpr uint32_t kTokenFileVersion = 1;
constexpr uint32_t kTokenFileHeaderBytes = 64;

struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;
  uint32_t token_bytes = 2;
  uint64_t num_tokens = 0;
  uint64_t num_documents = 0;
  uint32_t vocab_size = 0;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
};

// 2 when every id of a vocab of this size fits in uint16, else 4.
uint32_t token_bytes_for_vocab(uint32_t vocab_size);

// A read-only window onto token ids stored as uint16 or int32/uint32 (a token file's body,
// or a vector in memory). It does not own the ids: what it views must outlive it.
struct TokenView {
  const void* data = nullptr;
  uint64_t size = 0;         // number of tokens
  uint32_t token_bytes = 4;  // 2 or 4

  int32_t operator[](uint64_t i) const {
    return token_bytes == 2 ? static_cast<int32_t>(static_cast<const uint16_t*>(data)[i])
                            : static_cast<const int32_t*>(data)[i];
  }
  // Copies ids [begin, begin + count) to out (begin + count <= size).
  void copy(uint64_t begin, uint64_t count, int32_t* out) const;
};
TokenView view_of(const std::vector<int32_t>& ids);

// Streams documents into a token file. The file is written under "<path>.tmp" and renamed to
// `path` by finish(), so a reader never sees a half-written file; destroying a writer that
// was not finished removes the temporary file.
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, uint32_t vocab_size, int32_t bos_id, int32_t eos_id);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // Appends bos (when there is one), ids..., eos. Throws Error if an id is outside [0, vocab_size).
  void add_document(const std::vector<int32_t>& ids);
  // Writes the header, closes and renames the file; returns the final header.
  TokenFileHeader finish();

  const TokenFileHeader& header() const { return header_; }

 private:
  void append(int32_t id);
  void flush_buffer();

  std::string path_;
  std::string tmp_path_;
  std::ofstream out_;
  TokenFileHeader header_;
  std::vector<char> buffer_;
  bool finished_ = false;
};

// Writes documents (each as bos, ids..., eos; bos_id -1: ids..., eos) in one go.
TokenFileHeader write_token_file(const std::string& path,
                                 const std::vector<std::vector<int32_t>>& documents,
                                 uint32_t vocab_size, int32_t bos_id, int32_t eos_id);

// A token file mapped read-only into memory. Opening validates the magic, the version, the
// file size against the header (a truncated file is an Error naming the file, the expected
// and the actual size) and that every id is below vocab_size.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const TokenFileHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return header_.num_tokens; }
  int32_t operator[](uint64_t i) const { return view()[i]; }
  // The ids; valid while this TokenFile lives.
  TokenView view() const;
  std::vector<int32_t> read_all() const;

 private:
  void unmap();

  std::string path_;
  TokenFileHeader header_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// Reads only the header (validated like TokenFile, without the id scan).
TokenFileHeader read_token_file_header(const std::string& path);

}  // namespace frugal
