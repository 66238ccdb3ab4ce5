// core/regular_file.h: what is not a regular file is named (a FIFO, a directory, a socket, a
// device, a symlink loop, a dangling symlink), and nothing blocks; a regular file reads whole.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "catch_compat.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "non_regular_files.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;

TEST_CASE("regular files: what is not one is named, and nothing blocks", "[odd_files]") {
  TempDir tmp;
  const std::string regular = tmp.file("regular.txt");
  std::ofstream(regular) << "hello, file";
  CHECK(non_regular_kind(regular).empty());
  CHECK(read_regular_file(regular, "test file") == "hello, file");
  CHECK(RegularFile(regular, "test file").size_bytes() == 11);
  CHECK(RegularFile(regular, "test file").read_prefix(5) == "hello");
  CHECK(contains(error_of([&] { read_regular_file(regular, "test file", 10); }),
                 "is larger than 10 bytes"));
  CHECK(read_regular_file(regular, "test file", 11) == "hello, file");
  CHECK(contains(error_of([&] { require_regular_file(tmp.file("absent"), "test file"); }),
                 "test file '" + tmp.file("absent") + "' does not exist"));
  CHECK(non_regular_kind("/dev/zero") == "a character device");

  // A socket, which only the core helper meets (nothing else makes one).
  const std::string socket_path = tmp.file("socket");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof address.sun_path, "%s", socket_path.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  CHECK(non_regular_kind(socket_path) == "a socket");
  CHECK(refusal_problem([&] { RegularFile(socket_path, "test file"); }, socket_path,
                        "is a socket, not a regular file")
            .empty());
  ::close(fd);

  for (OddFile kind : odd_files()) {
    INFO(odd_file_name(kind));
    const std::string path = tmp.file(std::string("odd_") + odd_file_name(kind));
    make_odd_file(path, kind);
    CHECK(non_regular_kind(path) == odd_file_said(kind));
    const std::string said = std::string(odd_file_said(kind)) + ", not a regular file";
    CHECK(refusal_problem([&] { require_regular_file(path, "test file"); }, path, said).empty());
    CHECK(refusal_problem([&] { RegularFile(path, "test file"); }, path, said).empty());
    CHECK(refusal_problem([&] { read_regular_file(path, "test file"); }, path, said).empty());
  }
}
