// Checkpoint file layer: CRC32C against published vectors, HDF5 tensor round trips of every
// dtype and awkward shapes, and corrupt, truncated and missing files caught as clear errors.
#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "catch_compat.h"
#include "ckpt/crc32c.h"
#include "ckpt/h5_file.h"
#include "ckpt/isolated.h"
#include "core/error.h"
#include "core/tensor.h"
#include "test_support.h"

using namespace frugal;
using namespace frugal::test;
namespace fs = std::filesystem;

namespace {

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937 rng(seed);
  uint8_t* bytes = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.bytes(); ++i) bytes[i] = static_cast<uint8_t>(rng());
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// Runs `f` with stderr redirected to a file and returns what was written there.
std::string stderr_of(const std::function<void()>& f) {
  char name[] = "/tmp/frugal-stderr-XXXXXX";
  const int fd = mkstemp(name);
  REQUIRE(fd >= 0);
  fflush(stderr);
  const int saved = dup(2);
  dup2(fd, 2);
  f();
  fflush(stderr);
  dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in(name);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(name);
  return text;
}

struct Case {
  std::string name;
  Shape shape;
  DType dtype;
};

const std::vector<Case> kCases = {
    {"model/embed_tokens.weight", {37, 11}, DType::bf16},
    {"model/layers.0.self_attn.q_proj.weight", {1000, 700}, DType::f32},  // several chunks
    {"model/layers.0.input_layernorm.weight", {13}, DType::f32},
    {"model/norm.scale", {}, DType::f32},  // a scalar
    {"optim/step", {}, DType::i64},
    {"optim/m/embed", {3, 5, 7}, DType::f16},
    {"data/cursor", {4}, DType::i64},
    {"rng/state", {2, 312}, DType::u8},
    {"tokens", {5, 3}, DType::i32},
    {"empty/rows", {0}, DType::f32},
    {"empty/middle", {3, 0, 2}, DType::bf16},
    {"double/x", {9}, DType::f64},
    {"fp8/w", {17, 3}, DType::e4m3},
    {"fp8/g", {5}, DType::e5m2},
};

void write_cases(const std::string& path) {
  H5Writer writer(path);
  uint32_t seed = 1;
  for (const Case& c : kCases) writer.write_tensor(c.name, random_tensor(c.shape, c.dtype, seed++));
  writer.write_attribute("manifest", R"({"step": 1200, "mesh": [2, 4]})");
  writer.close();
}

}  // namespace

TEST_CASE("crc32c published vectors") {
  const char* digits = "123456789";
  CHECK(crc32c(digits, 9) == 0xE3069283u);
  CHECK(crc32c_software(digits, 9) == 0xE3069283u);
  // RFC 3720 appendix B.4 (iSCSI).
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<uint8_t>(i);
    down[i] = static_cast<uint8_t>(31 - i);
  }
  CHECK(crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(crc32c(up.data(), 32) == 0x46DD794Eu);
  CHECK(crc32c(down.data(), 32) == 0x113FDB5Cu);
  CHECK(crc32c_software(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(crc32c_software(ones.data(), 32) == 0x62A8AB43u);
  CHECK(crc32c_software(up.data(), 32) == 0x46DD794Eu);
  CHECK(crc32c_software(down.data(), 32) == 0x113FDB5Cu);
  CHECK(crc32c(digits, 0) == 0u);
}

TEST_CASE("crc32c: hardware and tables agree, and checksums chain") {
  std::mt19937 rng(3);
  std::vector<uint8_t> data(10007);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  for (size_t offset : {0, 1, 3, 7, 8}) {
    for (size_t length : {0, 1, 5, 8, 9, 63, 64, 1000, 9999}) {
      const uint8_t* p = data.data() + offset;
      const uint32_t whole = crc32c(p, length);
      REQUIRE(whole == crc32c_software(p, length));
      const size_t split = length / 3;
      REQUIRE(crc32c(p + split, length - split, crc32c(p, split)) == whole);
      REQUIRE(crc32c_software(p + split, length - split, crc32c_software(p, split)) == whole);
    }
  }
}

TEST_CASE("h5 tensors round trip in every dtype and shape") {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  write_cases(path);
  REQUIRE(fs::exists(path));
  REQUIRE_FALSE(fs::exists(path + ".tmp"));

  H5Reader reader(path);
  std::vector<std::string> expected_names;
  for (const Case& c : kCases) expected_names.push_back(c.name);
  std::sort(expected_names.begin(), expected_names.end());
  CHECK(reader.tensor_names() == expected_names);

  uint32_t seed = 1;
  for (const Case& c : kCases) {
    INFO(c.name);
    const Tensor expected = random_tensor(c.shape, c.dtype, seed++);
    CHECK(reader.has(c.name));
    CHECK(reader.shape_of(c.name) == c.shape);
    CHECK(reader.dtype_of(c.name) == c.dtype);
    const Tensor got = reader.read_tensor(c.name);
    CHECK(got.shape() == c.shape);
    CHECK(got.dtype() == c.dtype);
    CHECK(same_bytes(got, expected));
    Tensor into = Tensor::zeros(c.shape, c.dtype);
    reader.read_into(c.name, into);
    CHECK(same_bytes(into, expected));
  }
  CHECK_FALSE(reader.has("model"));  // a group, not a tensor
  CHECK_FALSE(reader.has("model/missing"));
  CHECK_FALSE(reader.has("nowhere/at/all"));
  CHECK(reader.has("/model/norm.scale"));  // a leading '/' is the same name

  const std::string missing = error_of([&] { reader.read_tensor("nowhere/x"); });
  CHECK(contains(missing, path));
  CHECK(contains(missing, "nowhere/x"));
  CHECK(contains(missing, "not found"));
  const std::string wrong_shape = error_of([&] {
    reader.read_into("tokens", Tensor::zeros({3, 5}, DType::i32));
  });
  CHECK(contains(wrong_shape, "tokens"));
  CHECK(contains(wrong_shape, "[5, 3]"));
}

TEST_CASE("h5 attributes round trip") {
  TempDir dir;
  const std::string path = dir.file("index.h5");
  std::string big(1 << 20, 'x');  // a large manifest: far past HDF5's 64 KiB object header
  for (size_t i = 0; i < big.size(); i += 97) big[i] = '{';
  {
    H5Writer writer(path);
    writer.write_attribute("manifest", big);
    writer.write_attribute("empty", "");
    writer.write_attribute("unicode", "Grüße, 世界");
    writer.write_attribute("replaced", "first");
    writer.write_attribute("replaced", "second");
    writer.close();
  }
  H5Reader reader(path);
  CHECK(reader.attribute("manifest") == big);
  CHECK(reader.attribute("empty").empty());
  CHECK(reader.attribute("unicode") == "Grüße, 世界");
  CHECK(reader.attribute("replaced") == "second");
  CHECK(reader.has_attribute("manifest"));
  CHECK_FALSE(reader.has_attribute("nope"));
  const std::string what = error_of([&] { reader.attribute("nope"); });
  CHECK(contains(what, path));
  CHECK(contains(what, "nope"));
  CHECK(reader.tensor_names().empty());
}

TEST_CASE("h5 writes are atomic") {
  TempDir dir;
  const std::string path = dir.file("a.h5");
  SECTION("nothing under the final name until close") {
    H5Writer writer(path);
    writer.write_tensor("w", random_tensor({4}, DType::f32, 1));
    CHECK(fs::exists(path + ".tmp"));
    CHECK_FALSE(fs::exists(path));
    writer.close();
    CHECK(fs::exists(path));
    CHECK_FALSE(fs::exists(path + ".tmp"));
    CHECK(contains(error_of([&] { writer.write_tensor("x", random_tensor({4}, DType::f32, 1)); }),
                   "after close"));
  }
  SECTION("an abandoned writer leaves nothing") {
    {
      H5Writer writer(path);
      writer.write_tensor("w", random_tensor({4}, DType::f32, 1));
    }
    CHECK_FALSE(fs::exists(path));
    CHECK_FALSE(fs::exists(path + ".tmp"));
  }
  SECTION("an earlier complete file stays until the new one replaces it") {
    write_cases(path);
    {
      H5Writer writer(path);
      writer.write_tensor("only", random_tensor({2}, DType::i32, 9));
      CHECK(H5Reader(path).has("tokens"));  // still the old file
      writer.close();
    }
    H5Reader reader(path);
    CHECK(reader.tensor_names() == std::vector<std::string>{"only"});
  }
  SECTION("a name written twice is an error") {
    H5Writer writer(path);
    writer.write_tensor("a/b", random_tensor({4}, DType::f32, 1));
    const std::string what =
        error_of([&] { writer.write_tensor("a/b", random_tensor({4}, DType::f32, 1)); });
    CHECK(contains(what, "a/b"));
    CHECK(contains(what, path));
    CHECK(contains(error_of([&] { writer.write_tensor("", random_tensor({1}, DType::f32, 1)); }),
                   "invalid tensor name"));
  }
  SECTION("a directory that does not exist") {
    const std::string bad = dir.file("no/such/dir/x.h5");
    CHECK(contains(error_of([&] { H5Writer writer(bad); }), bad));
  }
}

TEST_CASE("h5 corruption is caught") {
  TempDir dir;
  const std::string path = dir.file("rank_00001.h5");
  write_cases(path);

  SECTION("values changed behind the checksum's back") {
    // H5Dwrite recomputes Fletcher32, so only the CRC32C attribute can notice.
    {
      hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      REQUIRE(file >= 0);
      hid_t dataset = H5Dopen2(file, "tokens", H5P_DEFAULT);
      REQUIRE(dataset >= 0);
      std::vector<int32_t> values(15, 42);
      REQUIRE(H5Dwrite(dataset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >=
              0);
      H5Dclose(dataset);
      H5Fclose(file);
    }
    H5Reader reader(path);
    const std::string what = error_of([&] { reader.read_tensor("tokens"); });
    CHECK(contains(what,
                   "checkpoint file " + path + ": dataset tokens: checksum mismatch (stored 0x"));
    CHECK(contains(what, ", computed 0x"));
    // The other datasets are untouched.
    CHECK(reader.read_tensor("model/layers.0.input_layernorm.weight").numel() == 13);
  }

  SECTION("a byte flipped on disk") {
    haddr_t chunked = HADDR_UNDEF, contiguous = HADDR_UNDEF;
    {
      hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      REQUIRE(file >= 0);
      hid_t scalar = H5Dopen2(file, "model/norm.scale", H5P_DEFAULT);
      contiguous = H5Dget_offset(scalar);
      H5Dclose(scalar);
#if H5_VERSION_GE(1, 10, 5)
      hid_t dataset = H5Dopen2(file, "model/layers.0.input_layernorm.weight", H5P_DEFAULT);
      hid_t space = H5Dget_space(dataset);
      unsigned mask = 0;
      hsize_t chunk_bytes = 0;
      REQUIRE(H5Dget_chunk_info(dataset, space, 0, nullptr, &mask, &chunked, &chunk_bytes) >= 0);
      H5Sclose(space);
      H5Dclose(dataset);
#endif
      H5Fclose(file);
    }
    auto flip = [&](haddr_t at) {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(at) + 2);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x10);
      f.seekp(static_cast<std::streamoff>(at) + 2);
      f.write(&c, 1);
    };
    REQUIRE(contiguous != HADDR_UNDEF);
    flip(contiguous);                           // a scalar: no Fletcher32, the CRC32C catches it
    if (chunked != HADDR_UNDEF) flip(chunked);  // Fletcher32 catches it inside HDF5

    H5Reader reader(path);
    CHECK(contains(error_of([&] { reader.read_tensor("model/norm.scale"); }),
                   "dataset model/norm.scale: checksum mismatch"));
    if (chunked != HADDR_UNDEF) {
      const std::string what =
          error_of([&] { reader.read_tensor("model/layers.0.input_layernorm.weight"); });
      CHECK(contains(what, path));
      CHECK(contains(what, "dataset model/layers.0.input_layernorm.weight"));
    }
    CHECK(reader.read_tensor("tokens").numel() == 15);
  }

  SECTION("a file cut to half its size") {
    fs::resize_file(path, fs::file_size(path) / 2);
    std::string what;
    const std::string printed = stderr_of([&] {
      what = error_of([&] {
        H5Reader reader(path);
        for (const std::string& name : reader.tensor_names()) reader.read_tensor(name);
      });
    });
    CHECK(contains(what, "checkpoint file " + path));
    CHECK(printed.empty());  // no HDF5 error stack on stderr
  }
}

TEST_CASE("h5 dataset_storage: where each dataset's bytes lie, the rest being metadata") {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  write_cases(path);
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<H5Reader::ByteRange> ranges = H5Reader(path).dataset_storage();

  // Sorted, disjoint, inside the file; one range a chunk (q_proj has several), none for the
  // empty tensors.
  size_t non_empty = 0;
  for (const Case& c : kCases) non_empty += Tensor::zeros(c.shape, c.dtype).bytes() > 0;
  CHECK(ranges.size() > non_empty);
  int64_t end = 0, stored = 0;
  for (const H5Reader::ByteRange& r : ranges) {
    CHECK(r.offset >= end);
    CHECK(r.bytes > 0);
    end = r.offset + r.bytes;
    stored += r.bytes;
  }
  CHECK(end <= int64_t(file.size()));
  // Each dataset's first bytes (random, so found once) open one of the ranges.
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    INFO(c.name);
    const Tensor t = random_tensor(c.shape, c.dtype, seed++);
    if (t.bytes() < 8) continue;
    const size_t at = file.find(std::string(static_cast<const char*>(t.raw()), 8));
    REQUIRE(at != std::string::npos);
    CHECK(std::any_of(ranges.begin(), ranges.end(),
                      [&](const H5Reader::ByteRange& r) { return r.offset == int64_t(at); }));
  }
  // The rest is metadata: the manifest is there, outside every range.
  const size_t manifest = file.find(R"({"step": 1200)");
  REQUIRE(manifest != std::string::npos);
  CHECK(std::none_of(ranges.begin(), ranges.end(), [&](const H5Reader::ByteRange& r) {
    return int64_t(manifest) >= r.offset && int64_t(manifest) < r.offset + r.bytes;
  }));
  CHECK(stored < int64_t(file.size()));
}

TEST_CASE("h5 missing and foreign files") {
  TempDir dir;
  const std::string missing = dir.file("nope.h5");
  std::string what;
  const std::string printed =
      stderr_of([&] { what = error_of([&] { H5Reader reader(missing); }); });
  CHECK(contains(what, "checkpoint file '" + missing + "' does not exist"));
  CHECK(printed.empty());

  const std::string text = dir.file("notes.h5");
  std::ofstream(text) << "this is not HDF5\n";
  what = error_of([&] { H5Reader reader(text); });
  CHECK(contains(what, text));
  CHECK(contains(what, "not an HDF5 file"));
}

TEST_CASE("h5 datasets written by other tools") {
  // Written with the HDF5 API directly (as h5py would): no "dtype" attribute.
  TempDir dir;
  const std::string path = dir.file("foreign.h5");
  std::vector<float> values = {1.5f, -2.0f, 3.25f};
  std::vector<uint16_t> halves = {1, 2, 3};
  {
    hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[1] = {3};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t scalar = H5Screate(H5S_SCALAR);
    const uint32_t crc_values = crc32c(values.data(), values.size() * sizeof(float));
    const uint32_t crc_halves = crc32c(halves.data(), halves.size() * sizeof(uint16_t));
    for (auto [name, file_type, mem_type, data, crc] :
         {std::tuple{"f", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, (const void*)values.data(), crc_values},
          std::tuple{"h", H5T_STD_U16LE, H5T_NATIVE_UINT16, (const void*)halves.data(),
                     crc_halves}}) {
      hid_t dataset =
          H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      REQUIRE(H5Dwrite(dataset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
      hid_t attr = H5Acreate2(dataset, "crc32c", H5T_STD_U32LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
      REQUIRE(H5Awrite(attr, H5T_NATIVE_UINT32, &crc) >= 0);
      H5Aclose(attr);
      H5Dclose(dataset);
    }
    H5Sclose(scalar);
    H5Sclose(space);
    H5Fclose(file);
  }
  H5Reader reader(path);
  const Tensor f = reader.read_tensor("f");
  CHECK(f.dtype() == DType::f32);
  CHECK(f.data<float>()[2] == 3.25f);
  // 16 bits could be bf16, f16 or an integer: refused rather than guessed.
  CHECK(contains(error_of([&] { reader.read_tensor("h"); }), "no 'dtype' attribute"));
}

namespace {

// Leaves freed heap blocks of many sizes full of non-zero bytes, so that memory a library
// reads before writing holds garbage, as in a process that has run a while.
void fill_free_heap() {
  std::vector<void*> blocks;
  for (size_t bytes = 16; bytes <= 8192; bytes += 16) {
    blocks.push_back(std::malloc(bytes));
    std::memset(blocks.back(), 0xa5, bytes);
  }
  for (void* block : blocks) std::free(block);
}

}  // namespace

TEST_CASE("h5 listing a damaged group errs, and leaves no garbage behind") {
  // A group of more than 8 datasets is stored "dense" (a fractal heap and a B-tree of names).
  // HDF5 1.10's sorted iteration over it builds a table of the links and, when that fails
  // half-way on damaged metadata, frees the entries never filled: uninitialized pointers, so a
  // process that has used its heap a while crashes (SIGSEGV, or "free(): invalid pointer").
  // Every byte of the file's last KiB (its group indexes and headers) flipped in turn, each
  // listed several times in this one process: an Error or a good listing, never a crash.
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  {
    H5Writer writer(path);
    for (int i = 0; i < 12; ++i)
      for (const char* group : {"model", "optim/exp_avg", "optim/exp_avg_sq"})
        writer.write_tensor(std::string(group) + "/layers." + std::to_string(i) + ".weight",
                            random_tensor({3, 5}, DType::f32, uint32_t(i)));
    writer.close();
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  int errors = 0, listed = 0, named = 0;
  for (size_t at = bytes.size() > 1024 ? bytes.size() - 1024 : 0; at < bytes.size(); ++at) {
    std::string damaged = bytes;
    damaged[at] = char(damaged[at] ^ 0x01);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged;
    for (int repeat = 0; repeat < 3; ++repeat) {
      fill_free_heap();  // what a long-running process's heap would hold
      size_t count = 0;
      const std::string what = error_of([&] { count = H5Reader(path).tensor_names().size(); });
      if (what.empty())
        listed += count == 36;
      else
        ++errors, named += contains(what, path);
    }
  }
  CHECK(errors > 0);  // the sweep reached the group indexes
  CHECK(named == errors);
  CHECK(listed + errors == 3 * 1024);
}

TEST_CASE("run_isolated: a child's answer, its Error, its crash and its hang, by name") {
  IsolatedOutcome out = run_isolated([] { return std::string(100000, 'x'); }, 30);
  CHECK(out.ok);
  CHECK(out.text == std::string(100000, 'x'));  // larger than a pipe's buffer
  out = run_isolated([]() -> std::string { fail("checkpoint file 'a.h5': broken"); }, 30);
  CHECK(!out.ok);
  CHECK(out.text == "checkpoint file 'a.h5': broken");
  out = run_isolated(
      []() -> std::string {
        ::raise(SIGSEGV);
        return "";
      },
      30);
  CHECK(!out.ok);
  CHECK(out.crashed);
  CHECK(out.text == "crashed (signal 11, Segmentation fault)");
  // An exit without an answer (a library calling exit(), a sanitizer's report) is told apart,
  // so that the checks can name the file it was reading.
  out = run_isolated(
      []() -> std::string {
        ::_exit(3);
        return "";
      },
      30);
  CHECK(!out.ok);
  CHECK(out.ended);
  CHECK(!out.crashed);
  CHECK(out.text == "ended without an answer (exit status 3)");
  const auto start = std::chrono::steady_clock::now();
  out = run_isolated(
      []() -> std::string {
        for (;;) ::pause();
      },
      0.5);
  CHECK(!out.ok);
  CHECK(out.timed_out);
  CHECK(out.text == "did not finish within 0.5 s");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));

  // A crash handler of this process (Open MPI installs one that prints a backtrace, and can
  // deadlock in a damaged heap) does not run in the child: the crash is reported as a crash.
  struct sigaction stuck {
  }, saved{};
  stuck.sa_handler = [](int) {
    for (;;) ::pause();
  };
  sigaction(SIGSEGV, &stuck, &saved);
  out = run_isolated(
      []() -> std::string {
        ::raise(SIGSEGV);
        return "";
      },
      5);
  sigaction(SIGSEGV, &saved, nullptr);
  CHECK(out.crashed);
  CHECK(!out.timed_out);
}

namespace {
// Set by a request in the worker's child only: the damage an earlier file may leave behind.
bool g_child_poisoned = false;
bool g_child_retires = false;

// The requests of the fork server's test: "echo <text>" (the text reversed, and the child's
// pid), "error", "crash", "hang", "poison" (damages the child), "fragile" (crashes a damaged
// child only), "retire" (the child asks to end after answering).
std::string test_request(const std::string& request) {
  if (request.rfind("echo ", 0) == 0) {
    const std::string text = request.substr(5);
    return std::string(text.rbegin(), text.rend()) + " " + std::to_string(::getpid());
  }
  if (request == "error") fail("checkpoint file 'b.h5': broken");
  if (request == "crash") ::raise(SIGSEGV);
  if (request == "hang")
    for (;;) ::pause();
  if (request == "poison") g_child_poisoned = true;
  if (request == "fragile" && g_child_poisoned) ::raise(SIGSEGV);
  if (request == "retire") g_child_retires = true;
  return "sound";
}
}  // namespace

TEST_CASE(
    "IsolatedWorker: one child answers request after request and a crash or a hang costs it") {
  IsolatedWorker worker(test_request, [] { return !g_child_retires; });
  CHECK(worker.forks() == 0);  // forked on the first request
  std::string child_pid;
  for (int i = 0; i < 200; ++i) {
    const std::string text = "file_" + std::to_string(i * 7919);
    const IsolatedOutcome out = worker.run("echo " + text, 30);
    REQUIRE(out.ok);
    const std::string reversed(text.rbegin(), text.rend());
    CHECK(out.text.rfind(reversed + " ", 0) == 0);
    const std::string pid = out.text.substr(reversed.size() + 1);
    CHECK(pid != std::to_string(::getpid()));
    if (i == 0) child_pid = pid;
    CHECK(pid == child_pid);  // the same child every time
  }
  CHECK(worker.forks() == 1);

  // An Error is an answer: the child goes on.
  IsolatedOutcome out = worker.run("error", 30);
  CHECK(!out.ok);
  CHECK(!out.crashed);
  CHECK(out.text == "checkpoint file 'b.h5': broken");
  CHECK(worker.run("echo ab", 30).text == "ba " + child_pid);
  CHECK(worker.forks() == 1);

  // A crash in a child that had answered others is judged again in a fresh child (a second
  // fork), where it crashes too: reported by its signal. The next request gets a third child.
  out = worker.run("crash", 30);
  CHECK(!out.ok);
  CHECK(out.crashed);
  CHECK(out.text == "crashed (signal 11, Segmentation fault)");
  CHECK(worker.forks() == 2);
  out = worker.run("echo cd", 30);
  CHECK(out.ok);
  CHECK(out.text.rfind("dc ", 0) == 0);
  CHECK(out.text != "dc " + child_pid);
  CHECK(worker.forks() == 3);

  // A request that crashes only a child an earlier request damaged is not blamed for it.
  CHECK(worker.run("poison", 30).ok);
  out = worker.run("fragile", 30);
  CHECK(out.ok);
  CHECK(out.text == "sound");
  CHECK(worker.forks() == 4);

  // A hang: killed after the time limit (in the used child, then in a fresh one).
  const auto start = std::chrono::steady_clock::now();
  out = worker.run("hang", 0.5);
  CHECK(!out.ok);
  CHECK(out.timed_out);
  CHECK(!out.crashed);
  CHECK(out.text == "did not finish within 0.5 s");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  CHECK(worker.forks() == 5);
  CHECK(worker.run("echo x", 30).ok);
  CHECK(worker.forks() == 6);

  // A child that is not reusable after a request ends after answering it.
  CHECK(worker.run("retire", 30).text == "sound");
  CHECK(worker.forks() == 6);
  CHECK(worker.run("echo y", 30).ok);
  CHECK(worker.forks() == 7);
}

TEST_CASE("IsolatedWorker: a crash or a hang in a fresh child is reported without a second try") {
  IsolatedWorker worker(test_request);
  IsolatedOutcome out = worker.run("crash", 30);
  CHECK(out.crashed);
  CHECK(worker.forks() == 1);
  out = worker.run("hang", 0.3);
  CHECK(out.timed_out);
  CHECK(out.text == "did not finish within 0.3 s");
  CHECK(worker.forks() == 2);
  // An answer larger than a socket's buffer comes whole.
  const std::string large(300000, 'z');
  out = worker.run("echo " + large, 30);
  CHECK(out.ok);
  CHECK(out.text.substr(0, large.size()) == large);
  CHECK(worker.forks() == 3);
}
