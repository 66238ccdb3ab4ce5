// Token files (.tok): a 64-byte header, the token ids of every document, concatenated, where
// each document starts, and (for instruction and chat data) which part of its document each
// token is, so that training can tell a prompt from the reply it is to learn. Written by
// `frugal prepare`, read (mmap) by training and evaluation.
//
// Layout, little-endian (version 2; version 1 files, which end after the ids, still read):
//   offset  0  char[8]  magic "FRUGTOK1"
//           8  uint32   version (2)
//          12  uint32   token_bytes: 2 (uint16 ids, vocab <= 65536) or 4 (uint32 ids)
//          16  uint64   num_tokens
//          24  uint64   num_documents
//          32  uint32   vocab_size
//          36  int32    bos_id (-1: none)
//          40  int32    eos_id
//          44  uint32   header_bytes (64)
//          48  uint32   content: the kinds of document the file holds (DocumentContent bits)
//          52  uint32   flags: bit 0, the file holds a role per token
//          56  8 bytes  reserved, zero
//          64  num_tokens ids of token_bytes each, then zeros to a multiple of 8 bytes
//              num_documents + 1 uint64: the index of each document's first token, then
//              num_tokens (strictly increasing from 0: no document is empty)
//              with flag bit 0: num_tokens uint8 TokenRole values
//
// A text document is written as  bos, ids..., eos  (ids..., eos for a tokenizer without bos,
// such as Qwen2's): generation starts from bos and stops at eos. An instruction document is
// bos, prompt, completion, eos; a chat document is what the model's chat template renders
// (its own bos and end-of-turn tokens), written as it is.
#pragma once

#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "core/enum_names.h"

namespace frugal {

constexpr char kTokenFileMagic[8] = {'F', 'R', 'U', 'G', 'T', 'O', 'K', '1'};
constexpr uint32_t kTokenFileVersion = 2;
constexpr uint32_t kTokenFileHeaderBytes = 64;

// What kinds of document a token file holds (bits of TokenFileHeader::content). Version 1
// files hold text.
enum class DocumentContent : uint32_t {
  text = 1,         // plain text: every token is trained
  instruction = 2,  // a prompt and its completion (Alpaca, prompt/completion pairs)
  chat = 4,         // a conversation rendered by a chat template
};
inline std::span<const EnumName<DocumentContent>> enum_names(DocumentContent) {
  static constexpr EnumName<DocumentContent> names[] = {
      {DocumentContent::text, "text"},
      {DocumentContent::instruction, "instruction"},
      {DocumentContent::chat, "chat"}};
  return names;
}
constexpr uint32_t content_bit(DocumentContent c) { return static_cast<uint32_t>(c); }
// "text", "instruction", "chat", "instruction + chat".
std::string content_names(uint32_t content_bits);

// Which part of its document a token is; training selects the parts it learns from
// (data.train_on, data/train_on.h).
enum class TokenRole : uint8_t {
  prompt = 0,      // anything the model is given: system and user turns, an instruction, the
                   // template's own text before a reply, bos
  reply = 1,       // an assistant turn that is not the conversation's last
  last_reply = 2,  // the last assistant turn, or an instruction's completion (and its eos)
};
constexpr int kTokenRoles = 3;

struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;
  uint32_t token_bytes = 2;
  uint64_t num_tokens = 0;
  uint64_t num_documents = 0;
  uint32_t vocab_size = 0;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  uint32_t content = content_bit(DocumentContent::text);
  bool has_roles = false;
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

// A document ready to be written: its ids as they are to be stored and, for instruction and
// chat data, the role of each.
struct TokenizedDocument {
  std::vector<int32_t> ids;
  std::vector<TokenRole> roles;  // empty for text, else one per id
  DocumentContent content = DocumentContent::text;
};

// Streams documents into a token file. The file is written under "<path>.tmp" (the roles
// under "<path>.roles.tmp" until finish() appends them) and renamed to `path` by finish(), so a
// reader never sees a half-written file; destroying a writer that was not finished removes
// the temporary files.
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, uint32_t vocab_size, int32_t bos_id, int32_t eos_id);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // Appends a text document: bos (when there is one), ids..., eos. Throws Error if an id is
  // outside [0, vocab_size).
  void add_document(const std::vector<int32_t>& ids);
  // Appends a document as it is (its ids already hold whatever bos and eos it has). Throws
  // Error for an empty document, an id outside the vocabulary, or roles that do not match
  // the ids; documents with roles and without cannot share a file.
  void add_document(const TokenizedDocument& document);
  // Writes the header and the sections after the ids, closes and renames the file; returns
  // the final header.
  TokenFileHeader finish();

  const TokenFileHeader& header() const { return header_; }

 private:
  void append(int32_t id);
  void flush_buffer();
  void check_ids(const std::vector<int32_t>& ids) const;

  std::string path_;
  std::string tmp_path_;
  std::string roles_path_;
  std::ofstream out_;
  std::ofstream roles_out_;
  TokenFileHeader header_;
  std::vector<char> buffer_;
  std::vector<uint64_t> document_starts_{0};
  bool any_document_ = false;
  bool finished_ = false;
};

// Writes text documents (each as bos, ids..., eos; bos_id -1: ids..., eos) in one go.
TokenFileHeader write_token_file(const std::string& path,
                                 const std::vector<std::vector<int32_t>>& documents,
                                 uint32_t vocab_size, int32_t bos_id, int32_t eos_id);

// A token file mapped read-only into memory. Opening validates the magic, the version, the
// file size against the header (a truncated file is an Error naming the file, the expected
// and the actual size), bos and eos, that every id is below vocab_size, that the document
// starts rise from 0 to num_tokens and that every role is a TokenRole.
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
  // The role of every token (num_tokens values), or nullptr when the file has none (text, and
  // every version 1 file): every token is then trained.
  const TokenRole* roles() const;
  // Where each document starts, then num_tokens (num_documents + 1 values); empty for a
  // version 1 file, which does not record it.
  std::span<const uint64_t> document_starts() const;

 private:
  void unmap();

  std::string path_;
  TokenFileHeader header_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// Reads only the header (validated like TokenFile, without the scan of ids, starts and roles).
TokenFileHeader read_token_file_header(const std::string& path);

}  // namespace frugal
