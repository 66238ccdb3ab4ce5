// CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum stored with every
// checkpoint dataset. SSE4.2's crc32 instruction when the CPU has it, else slice-by-8 tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace frugal {

// The CRC32C of `bytes` bytes at `data`. `crc` is the CRC of the bytes before these, so that
// crc32c(b, nb, crc32c(a, na)) == crc32c(a followed by b); 0 starts a new checksum.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

// The CRC32C of the whole regular file `path` (an Error naming it as `what` when it cannot
// be read, or is not a regular file).
uint32_t file_crc32c(const std::string& path, const std::string& what);

// The portable table-driven implementation, same result; exposed for tests and comparison.
uint32_t crc32c_software(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace frugal
