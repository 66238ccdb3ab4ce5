// CRC32C: slice-by-8 tables (eight bytes per step, ~1-2 GB/s) and, on x86-64 CPUs with
// SSE4.2, the crc32 instruction (~8 GB/s), chosen once at run time.
#include "ckpt/crc32c.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/regular_file.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace frugal {

namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

using Tables = std::array<std::array<uint32_t, 256>, 8>;

// tables[0] is the classic byte-at-a-time table; tables[k][b] is the CRC of byte b followed by
// k zero bytes, which lets one step fold eight input bytes with eight lookups.
constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (kPolynomial & (0u - (c & 1u)));
    t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
  return t;
}

constexpr Tables kTables = make_tables();

uint32_t update_bytes(uint32_t c, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) c = (c >> 8) ^ kTables[0][(c ^ p[i]) & 0xFF];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, size_t bytes,
                                                        uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; bytes && (reinterpret_cast<uintptr_t>(p) & 7); --bytes) c = _mm_crc32_u8(c, *p++);
  uint64_t c64 = c;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c64 = _mm_crc32_u64(c64, word);
  }
  c = static_cast<uint32_t>(c64);
  for (; bytes; --bytes) c = _mm_crc32_u8(c, *p++);
  return ~c;
}

bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c_software(const void* data, size_t bytes, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  if constexpr (std::endian::native == std::endian::little) {
    const size_t head = std::min(bytes, (8 - (reinterpret_cast<uintptr_t>(p) & 7)) & 7);
    c = update_bytes(c, p, head);
    p += head;
    bytes -= head;
    for (; bytes >= 8; bytes -= 8, p += 8) {
      uint64_t word;
      std::memcpy(&word, p, 8);
      word ^= c;
      c = kTables[7][word & 0xFF] ^ kTables[6][(word >> 8) & 0xFF] ^
          kTables[5][(word >> 16) & 0xFF] ^ kTables[4][(word >> 24) & 0xFF] ^
          kTables[3][(word >> 32) & 0xFF] ^ kTables[2][(word >> 40) & 0xFF] ^
          kTables[1][(word >> 48) & 0xFF] ^ kTables[0][word >> 56];
    }
  }
  c = update_bytes(c, p, bytes);
  return ~c;
}

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
#if defined(__x86_64__)
  if (cpu_has_sse42()) return crc32c_sse42(data, bytes, crc);
#endif
  return crc32c_software(data, bytes, crc);
}

uint32_t file_crc32c(const std::string& path, const std::string& what) {
  const RegularFile file(path, what);
  std::vector<char> buffer(size_t(1) << 20);
  uint32_t crc = 0;
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(file.fd(), buffer.data(), buffer.size(), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(what, " '", path, "' cannot be read: ", std::strerror(errno));
    if (n == 0) return crc;
    crc = crc32c(buffer.data(), size_t(n), crc);
    at += n;
  }
}

}  // namespace frugal
