// Files replaced whole or not at all: the new content goes to "<path>.tmp", reaches the disk,
// and only then takes the name; a failure on the way (a full disk) leaves the old file as it was.
#pragma once

#include <cstddef>
#include <string>

namespace frugal {

// Makes `text` the content of `path`: a temporary file beside it, fsync, rename, fsync of the
// directory. An Error naming the file and the system's reason when a step before the rename
// fails; `path` is then unchanged and the temporary file removed.
void replace_file(const std::string& path, const std::string& text);

// Writes all `size` bytes to `fd`, going on after short writes and EINTR; false, with errno
// set, when the system refuses (ENOSPC, EIO, ...).
bool write_all(int fd, const char* data, size_t size);

}  // namespace frugal
