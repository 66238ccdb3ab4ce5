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
  if (h.version != kTokenFileVersion)
    fail("token file '", path, "' has version ", h.version, "; this frugal reads version ",
         kTokenFileVersion);
  if (h.token_bytes != 2 && h.token_bytes != 4)
    fail("token file '", path, "' has token_bytes ", h.token_bytes, " (expected 2 or 4)");
  if (header_bytes != kTokenFileHeaderBytes)
    fail("token file '", path, "' has header_bytes ", header_bytes, " (expected ",
         kTokenFileHeaderBytes, ")");
  if (h.vocab_size == 0 || uint64_t{h.vocab_size} > (uint64_t{1} << (8 * h.token_bytes)))
    fail("token file '", path, "' has vocab size ", h.vocab_size, ", which does not fit ",
         h.token_bytes, "-byte ids");
  // A corrupt count must not wrap around into a size that matches the file.
  const uint64_t expected =
      checked_add<uint64_t>(kTokenFileHeaderBytes,
                            checked_mul<uint64_t>(h.num_tokens, h.token_bytes, "token file '", path,
                                                  "': its header's num_tokens x token_bytes"),
                            "token file '", path, "': header + token bytes");
  if (file_bytes != expected)
    fail("token file '", path, "' is ", file_bytes < expected ? "truncated" : "too long",
         ": its header promises ", h.num_tokens, " tokens = ", expected, " bytes, the file has ",
         file_bytes, " bytes");
  return h;
}

}  // namespace

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
    : path_(path), tmp_path_(path + ".tmp") {
  if (vocab_size == 0) fail("token file '", path, "': vocab size 0");
  if (bos_id < -1 || (bos_id >= 0 && uint32_t(bos_id) >= vocab_size) || eos_id < 0 ||
      uint32_t(eos_id) >= vocab_size)
    fail("token file '", path, "': bos id ", bos_id, " and eos id ", eos_id,
         " must lie in the vocabulary [0, ", vocab_size, ") (bos -1: none)");
  header_.token_bytes = token_bytes_for_vocab(vocab_size);
  header_.vocab_size = vocab_size;
  header_.bos_id = bos_id;
  header_.eos_id = eos_id;
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
    std::remove(tmp_path_.c_str());
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

void TokenFileWriter::add_document(const std::vector<int32_t>& ids) {
  FRUGAL_CHECK(!finished_, "token file '", path_, "' already finished");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || uint32_t(ids[i]) >= header_.vocab_size)
      fail("token file '", path_, "': document ", header_.num_documents, " has id ", ids[i],
           " at position ", i, ", outside the vocabulary [0, ", header_.vocab_size, ")");
  if (header_.bos_id >= 0) append(header_.bos_id);
  for (int32_t id : ids) append(id);
  append(header_.eos_id);
  ++header_.num_documents;
}

TokenFileHeader TokenFileWriter::finish() {
  FRUGAL_CHECK(!finished_, "token file '", path_, "' already finished");
  flush_buffer();
  char header[kTokenFileHeaderBytes];
  encode_header(header_, header);
  out_.seekp(0);
  out_.write(header, sizeof(header));
  out_.close();
  if (!out_) fail("writing token file '", tmp_path_, "' failed");
  std::error_code ec;
  std::filesystem::rename(tmp_path_, path_, ec);
  if (ec) fail("cannot rename '", tmp_path_, "' to '", path_, "': ", ec.message());
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
