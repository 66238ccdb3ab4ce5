// Token file writer and memory-mapped reader.
#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/checked.h"
#include "core/error.h"
#include "core/regular_file.h"

namespace frugal {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and read in place");

namespace {

constexpr uint32_t kHasRolesFlag = 1;
constexpr uint32_t kAllContentBits = content_bit(DocumentContent::text) |
                                     content_bit(DocumentContent::instruction) |
                                     content_bit(DocumentContent::chat);

// Bytes from the start of the file to the document starts: the ids padded to 8 bytes.
uint64_t starts_offset(uint64_t ids_bytes) {
  return kTokenFileHeaderBytes + (ids_bytes + 7) / 8 * 8;
}

template <class T>
void put(char* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}
template <class T>
T get(const char* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

void encode_header(const TokenFileHeader& h, char* out) {
  std::memset(out, 0, kTokenFileHeaderBytes);
  std::memcpy(out, kTokenFileMagic, sizeof(kTokenFileMagic));
  put<uint32_t>(out + 8, h.version);
  put<uint32_t>(out + 12, h.token_bytes);
  put<uint64_t>(out + 16, h.num_tokens);
  put<uint64_t>(out + 24, h.num_documents);
  put<uint32_t>(out + 32, h.vocab_size);
  put<int32_t>(out + 36, h.bos_id);
  put<int32_t>(out + 40, h.eos_id);
  put<uint32_t>(out + 44, kTokenFileHeaderBytes);
  put<uint32_t>(out + 48, h.content);
  put<uint32_t>(out + 52, h.has_roles ? kHasRolesFlag : 0u);
}

// Parses and checks a header against the file's size in bytes.
TokenFileHeader decode_header(const char* in, uint64_t file_bytes, const std::string& path) {
  if (file_bytes < sizeof(kTokenFileMagic) ||
      std::memcmp(in, kTokenFileMagic, sizeof(kTokenFileMagic)) != 0)
    fail("'", path, "' is not a frugal token file (no FRUGTOK1 magic)");
  if (file_bytes < kTokenFileHeaderBytes)
    fail("token file '", path, "' is truncated: ", file_bytes, " bytes, shorter than its ",
         kTokenFileHeaderBytes, "-byte header");
  TokenFileHeader h;
  h.version = get<uint32_t>(in + 8);
  h.token_bytes = get<uint32_t>(in + 12);
  h.num_tokens = get<uint64_t>(in + 16);
  h.num_documents = get<uint64_t>(in + 24);
  h.vocab_size = get<uint32_t>(in + 32);
  h.bos_id = get<int32_t>(in + 36);
  h.eos_id = get<int32_t>(in + 40);
  const auto header_bytes = get<uint32_t>(in + 44);
  if (h.version != 1 && h.version != kTokenFileVersion)
    fail("token file '", path, "' has version ", h.version, "; this frugal reads versions 1 and ",
         kTokenFileVersion);
  if (h.token_bytes != 2 && h.token_bytes != 4)
    fail("token file '", path, "' has token_bytes ", h.token_bytes, " (expected 2 or 4)");
  if (header_bytes != kTokenFileHeaderBytes)
    fail("token file '", path, "' has header_bytes ", header_bytes, " (expected ",
         kTokenFileHeaderBytes, ")");
  if (h.vocab_size == 0 || uint64_t{h.vocab_size} > (uint64_t{1} << (8 * h.token_bytes)))
    fail("token file '", path, "' has vocab size ", h.vocab_size, ", which does not fit ",
         h.token_bytes, "-byte ids");
  // Generation starts from bos and stops at eos: ids outside the vocabulary would index past
  // the embedding table there.
  if (h.bos_id < -1 || (h.bos_id >= 0 && uint32_t(h.bos_id) >= h.vocab_size))
    fail("token file '", path, "' has bos id ", h.bos_id, ", outside the vocabulary [0, ",
         h.vocab_size, ") (-1: none)");
  if (h.eos_id < 0 || uint32_t(h.eos_id) >= h.vocab_size)
    fail("token file '", path, "' has eos id ", h.eos_id, ", outside the vocabulary [0, ",
         h.vocab_size, ")");
  const auto what = [&](const char* part) {
    return detail::concat("token file '", path, "': ", part);
  };
  // A corrupt count must not wrap around into a size that matches the file.
  const uint64_t ids_bytes =
      checked_mul<uint64_t>(h.num_tokens, h.token_bytes, "token file '", path,
                            "': its header's num_tokens x token_bytes");
  uint64_t expected = checked_add<uint64_t>(kTokenFileHeaderBytes, ids_bytes, "token file '", path,
                                            "': header + token bytes");
  if (h.version == 1) {
    h.content = content_bit(DocumentContent::text);
  } else {
    h.content = get<uint32_t>(in + 48);
    const auto flags = get<uint32_t>(in + 52);
    if (h.content == 0 || (h.content & ~kAllContentBits) != 0)
      fail("token file '", path, "' has content bits ", h.content, " (expected a non-empty ",
           "set of 1 text, 2 instruction, 4 chat)");
    if ((flags & ~kHasRolesFlag) != 0) fail("token file '", path, "' has unknown flags ", flags);
    h.has_roles = (flags & kHasRolesFlag) != 0;
    if (h.has_roles != (h.content != content_bit(DocumentContent::text)))
      fail("token file '", path, "' holds ", content_names(h.content), " documents ",
           h.has_roles ? "with" : "without", " token roles");
    const uint64_t starts_bytes =
        checked_mul<uint64_t>(checked_add<uint64_t>(h.num_documents, 1, what("num_documents + 1")),
                              8, what("its header's document starts"));
    expected = checked_add<uint64_t>(starts_offset(ids_bytes), starts_bytes,
                                     what("the ids and the document starts"));
    if (h.has_roles) expected = checked_add<uint64_t>(expected, h.num_tokens, what("the roles"));
  }
  if (file_bytes != expected)
    fail("token file '", path, "' is ", file_bytes < expected ? "truncated" : "too long",
         ": its header promises ", h.num_tokens, " tokens", h.version == 1 ? "" : " and ",
         h.version == 1 ? std::string() : std::to_string(h.num_documents) + " documents", " = ",
         expected, " bytes, the file has ", file_bytes, " bytes");
  return h;
}

}  // namespace

std::string content_names(uint32_t content_bits) {
  std::string names;
  for (const EnumName<DocumentContent>& n : enum_names(DocumentContent{}))
    if (content_bits & content_bit(n.value)) {
      if (!names.empty()) names += " + ";
      names += n.name;
    }
  return names.empty() ? "nothing" : names;
}

uint32_t token_bytes_for_vocab(uint32_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

void TokenView::copy(uint64_t begin, uint64_t count, int32_t* out) const {
  FRUGAL_CHECK(begin + count <= size, "begin ", begin, " count ", count, " size ", size);
  if (count == 0) return;  // `out` may then be null (an empty vector), which memcpy must not see
  if (token_bytes == 4) {
    std::memcpy(out, static_cast<const int32_t*>(data) + begin, count * sizeof(int32_t));
  } else {
    const uint16_t* in = static_cast<const uint16_t*>(data) + begin;
    for (uint64_t i = 0; i < count; ++i) out[i] = in[i];
  }
}

TokenView view_of(const std::vector<int32_t>& ids) { return TokenView{ids.data(), ids.size(), 4}; }

// --- writer ---------------------------------------------------------------------------

TokenFileWriter::TokenFileWriter(const std::string& path, uint32_t vocab_size, int32_t bos_id,
                                 int32_t eos_id)
    : path_(path), tmp_path_(path + ".tmp"), roles_path_(path + ".roles.tmp") {
  if (vocab_size == 0) fail("token file '", path, "': vocab size 0");
  if (bos_id < -1 || (bos_id >= 0 && uint32_t(bos_id) >= vocab_size) || eos_id < 0 ||
      uint32_t(eos_id) >= vocab_size)
    fail("token file '", path, "': bos id ", bos_id, " and eos id ", eos_id,
         " must lie in the vocabulary [0, ", vocab_size, ") (bos -1: none)");
  header_.token_bytes = token_bytes_for_vocab(vocab_size);
  header_.vocab_size = vocab_size;
  header_.bos_id = bos_id;
  header_.eos_id = eos_id;
  header_.content = 0;  // the documents' kinds, as they come
  out_.open(tmp_path_, std::ios::binary | std::ios::trunc);
  if (!out_) fail("cannot create token file '", tmp_path_, "'");
  char header[kTokenFileHeaderBytes];
  encode_header(header_, header);  // rewritten with the counts by finish()
  out_.write(header, sizeof(header));
  buffer_.reserve(1 << 20);
}

TokenFileWriter::~TokenFileWriter() {
  if (!finished_) {
    out_.close();
    roles_out_.close();
    std::remove(tmp_path_.c_str());
    std::remove(roles_path_.c_str());
  }
}

void TokenFileWriter::append(int32_t id) {
  char bytes[4];
  if (header_.token_bytes == 2)
    put<uint16_t>(bytes, static_cast<uint16_t>(id));
  else
    put<uint32_t>(bytes, static_cast<uint32_t>(id));
  buffer_.insert(buffer_.end(), bytes, bytes + header_.token_bytes);
  ++header_.num_tokens;
  if (buffer_.size() >= (1 << 20)) flush_buffer();
}

void TokenFileWriter::flush_buffer() {
  out_.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
  if (!out_) fail("writing token file '", tmp_path_, "' failed (disk full?)");
  buffer_.clear();
}

void TokenFileWriter::check_ids(const std::vector<int32_t>& ids) const {
  FRUGAL_CHECK(!finished_, "token file '", path_, "' already finished");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || uint32_t(ids[i]) >= header_.vocab_size)
      fail("token file '", path_, "': document ", header_.num_documents, " has id ", ids[i],
           " at position ", i, ", outside the vocabulary [0, ", header_.vocab_size, ")");
}

void TokenFileWriter::add_document(const std::vector<int32_t>& ids) {
  check_ids(ids);
  if (header_.has_roles)
    fail("token file '", path_, "': a text document cannot follow instruction or chat ",
         "documents in one file");
  if (header_.bos_id >= 0) append(header_.bos_id);
  for (int32_t id : ids) append(id);
  append(header_.eos_id);
  ++header_.num_documents;
  header_.content |= content_bit(DocumentContent::text);
  document_starts_.push_back(header_.num_tokens);
  any_document_ = true;
}

void TokenFileWriter::add_document(const TokenizedDocument& document) {
  if (document.content == DocumentContent::text && document.roles.empty()) {
    check_ids(document.ids);
    if (document.ids.empty())
      fail("token file '", path_, "': document ", header_.num_documents, " is empty");
    if (header_.has_roles)
      fail("token file '", path_, "': a text document cannot follow instruction or chat ",
           "documents in one file");
    for (int32_t id : document.ids) append(id);
  } else {
    check_ids(document.ids);
    if (document.content == DocumentContent::text || document.roles.size() != document.ids.size())
      fail("token file '", path_, "': document ", header_.num_documents, " (",
           enum_name(document.content), ") has ", document.ids.size(), " ids and ",
           document.roles.size(), " roles");
    if (document.ids.empty())
      fail("token file '", path_, "': document ", header_.num_documents, " is empty");
    if (any_document_ && !header_.has_roles)
      fail("token file '", path_, "': ", enum_name(document.content),
           " documents cannot follow text documents in one file");
    if (!header_.has_roles) {
      roles_out_.open(roles_path_, std::ios::binary | std::ios::trunc);
      if (!roles_out_) fail("cannot create '", roles_path_, "'");
      header_.has_roles = true;
    }
    roles_out_.write(reinterpret_cast<const char*>(document.roles.data()),
                     static_cast<std::streamsize>(document.roles.size()));
    if (!roles_out_) fail("writing '", roles_path_, "' failed (disk full?)");
    for (int32_t id : document.ids) append(id);
  }
  ++header_.num_documents;
  header_.content |= content_bit(document.content);
  document_starts_.push_back(header_.num_tokens);
  any_document_ = true;
}

TokenFileHeader TokenFileWriter::finish() {
  FRUGAL_CHECK(!finished_, "token file '", path_, "' already finished");
  if (header_.content == 0) header_.content = content_bit(DocumentContent::text);  // no document
  // Zeros up to the document starts' 8-byte alignment, then the starts.
  const uint64_t ids_bytes = header_.num_tokens * header_.token_bytes;
  buffer_.resize(buffer_.size() + (starts_offset(ids_bytes) - kTokenFileHeaderBytes - ids_bytes),
                 '\0');
  flush_buffer();
  out_.write(reinterpret_cast<const char*>(document_starts_.data()),
             static_cast<std::streamsize>(document_starts_.size() * sizeof(uint64_t)));
  if (header_.has_roles) {
    roles_out_.close();
    if (!roles_out_) fail("writing '", roles_path_, "' failed (disk full?)");
    std::ifstream roles(roles_path_, std::ios::binary);
    out_ << roles.rdbuf();
    if (!roles || !out_) fail("appending '", roles_path_, "' to '", tmp_path_, "' failed");
  }
  char header[kTokenFileHeaderBytes];
  encode_header(header_, header);
  out_.seekp(0);
  out_.write(header, sizeof(header));
  out_.close();
  if (!out_) fail("writing token file '", tmp_path_, "' failed (disk full?)");
  std::error_code ec;
  std::filesystem::rename(tmp_path_, path_, ec);
  if (ec) fail("cannot rename '", tmp_path_, "' to '", path_, "': ", ec.message());
  std::remove(roles_path_.c_str());
  finished_ = true;
  return header_;
}

TokenFileHeader write_token_file(const std::string& path,
                                 const std::vector<std::vector<int32_t>>& documents,
                                 uint32_t vocab_size, int32_t bos_id, int32_t eos_id) {
  TokenFileWriter writer(path, vocab_size, bos_id, eos_id);
  for (const auto& doc : documents) writer.add_document(doc);
  return writer.finish();
}

// --- reader ---------------------------------------------------------------------------

TokenFile::TokenFile(const std::string& path) : path_(path) {
  require_regular_file(path, "token file");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open token file '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat token file '", path, "': ", std::strerror(err));
  }
  map_bytes_ = static_cast<size_t>(st.st_size);
  if (map_bytes_ > 0) {
    map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map_ == MAP_FAILED) {
      int err = errno;
      map_ = nullptr;
      ::close(fd);
      fail("cannot map token file '", path, "': ", std::strerror(err));
    }
  }
  ::close(fd);
  try {
    char empty[kTokenFileHeaderBytes] = {};
    header_ = decode_header(map_ ? static_cast<const char*>(map_) : empty, map_bytes_, path);
    // One pass over the ids: a corrupt id would otherwise index past the embedding table.
    const TokenView ids = view();
    for (uint64_t i = 0; i < ids.size; ++i) {
      const int32_t id = ids[i];
      if (id < 0 || uint32_t(id) >= header_.vocab_size)
        fail("token file '", path, "': id ", static_cast<uint32_t>(id), " at position ", i,
             " is outside the vocabulary [0, ", header_.vocab_size, ")");
    }
    // Windows and packing index by the starts, the loss by the roles.
    const std::span<const uint64_t> starts = document_starts();
    if (!starts.empty()) {
      if (starts.front() != 0 || starts.back() != header_.num_tokens)
        fail("token file '", path, "': its document starts run from ", starts.front(), " to ",
             starts.back(), ", not from 0 to its ", header_.num_tokens, " tokens");
      for (size_t d = 1; d < starts.size(); ++d)
        if (starts[d] <= starts[d - 1])
          fail("token file '", path, "': document ", d - 1, " starts at token ", starts[d - 1],
               " and ends at ", starts[d], " (documents are never empty)");
    }
    if (const TokenRole* role = roles())
      for (uint64_t i = 0; i < header_.num_tokens; ++i)
        if (static_cast<uint8_t>(role[i]) >= kTokenRoles)
          fail("token file '", path, "': token ", i, " has role ", int(role[i]),
               " (expected 0 prompt, 1 reply or 2 last reply)");
  } catch (...) {
    unmap();
    throw;
  }
}

TokenFile::~TokenFile() { unmap(); }

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      header_(other.header_),
      map_(other.map_),
      map_bytes_(other.map_bytes_) {
  other.map_ = nullptr;
  other.map_bytes_ = 0;
}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    header_ = other.header_;
    map_ = other.map_;
    map_bytes_ = other.map_bytes_;
    other.map_ = nullptr;
    other.map_bytes_ = 0;
  }
  return *this;
}

void TokenFile::unmap() {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

TokenView TokenFile::view() const {
  return TokenView{map_ ? static_cast<const char*>(map_) + kTokenFileHeaderBytes : nullptr,
                   header_.num_tokens, header_.token_bytes};
}

std::span<const uint64_t> TokenFile::document_starts() const {
  if (header_.version == 1 || !map_) return {};
  const char* at =
      static_cast<const char*>(map_) + starts_offset(header_.num_tokens * header_.token_bytes);
  // 8-byte aligned: the mapping is page-aligned and the offset a multiple of 8.
  return {reinterpret_cast<const uint64_t*>(at), header_.num_documents + 1};
}

const TokenRole* TokenFile::roles() const {
  if (!header_.has_roles || !map_) return nullptr;
  const std::span<const uint64_t> starts = document_starts();
  return reinterpret_cast<const TokenRole*>(starts.data() + starts.size());
}

std::vector<int32_t> TokenFile::read_all() const {
  std::vector<int32_t> ids(header_.num_tokens);
  view().copy(0, ids.size(), ids.data());
  return ids;
}

TokenFileHeader read_token_file_header(const std::string& path) {
  require_regular_file(path, "token file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("cannot open token file '", path, "'");
  const auto file_bytes = static_cast<uint64_t>(in.tellg());
  char header[kTokenFileHeaderBytes] = {};
  in.seekg(0);
  in.read(header, static_cast<std::streamsize>(std::min<uint64_t>(file_bytes, sizeof(header))));
  return decode_header(header, file_bytes, path);
}

}  // namespace frugal
