// HDF5 tensor files: H5Writer writes frugal tensors as checksummed datasets and string
// attributes, atomically (write "<path>.tmp", fsync, rename); H5Reader reads and verifies them.
//
// On disk, each tensor is one dataset named by its key; '/' separates groups, so
// "model/layers.0.self_attn.q_proj.weight" is the dataset "layers.0.self_attn.q_proj.weight" in
// the group "model". A dataset:
//   - stored in its own element type: f32/f64 as IEEE floats, i32/i64/u8 as integers, bf16 and
//     f16 as uint16, e4m3 and e5m2 as uint8; the string attribute "dtype" ("bf16", ...) on every
//     dataset tells them apart;
//   - every string attribute fixed-length, so that a file holds no variable-length data and
//     no global heap (files of earlier versions, with variable-length ones, are read too);
//   - chunked with the Fletcher32 filter, except scalars (rank 0, stored as HDF5 scalars) and
//     empty tensors, which HDF5 cannot chunk and which are stored contiguously;
//   - the uint32 attribute "crc32c": CRC32C of the tensor's raw bytes, checked on every read.
// Every failure, HDF5's included, becomes a frugal::Error naming the file and the dataset;
// HDF5's own error printing is switched off.
//
// Not thread-safe: one writer or reader per thread, and HDF5 calls of different threads
// serialize inside the library (Debian's libhdf5 is built thread-safe).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace frugal {

class H5Writer {
 public:
  // Creates (truncating) "<path>.tmp"; nothing appears under `path` until close().
  explicit H5Writer(const std::string& path);
  // Without close(), the temporary file is removed: an abandoned write leaves nothing behind.
  ~H5Writer();
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;
  H5Writer(H5Writer&& other) noexcept;
  H5Writer& operator=(H5Writer&& other) noexcept;

  // A host tensor under `name`; '/' separates groups, which are created as needed. Writing a
  // name twice is an error.
  void write_tensor(const std::string& name, const Tensor& tensor);
  // A UTF-8 string attribute on the file's root group (replaced if it exists), e.g. a JSON
  // manifest; any size (a fixed-length string of its bytes: no global heap in the file; past
  // the object header's 64 KiB, HDF5 keeps it in the dense attribute storage).
  void write_attribute(const std::string& name, const std::string& value);
  // Closes the HDF5 file, fsyncs it, renames "<path>.tmp" to `path` and fsyncs the directory.
  void close();

  const std::string& path() const { return path_; }
  bool is_open() const { return file_id_ >= 0; }

 private:
  void abandon() noexcept;

  std::string path_;
  std::string tmp_path_;
  int64_t file_id_ = -1;  // hid_t
};

class H5Reader {
 public:
  // Opens `path` read-only; throws if it is missing, not HDF5, or truncated.
  explicit H5Reader(const std::string& path);
  ~H5Reader();
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;
  H5Reader(H5Reader&& other) noexcept;
  H5Reader& operator=(H5Reader&& other) noexcept;

  // Every dataset in the file, by full name without the leading '/', sorted.
  std::vector<std::string> tensor_names() const;
  bool has(const std::string& name) const;
  Shape shape_of(const std::string& name) const;
  DType dtype_of(const std::string& name) const;

  // Reads a tensor into a new buffer of `arena` (a host arena), verifying Fletcher32 and the
  // CRC32C; a mismatch throws "checkpoint file X: dataset Y: checksum mismatch (...)".
  Tensor read_tensor(const std::string& name, Arena& arena = host_arena()) const;
  // The same into an existing host tensor whose shape and dtype must match the dataset's.
  void read_into(const std::string& name, const Tensor& out) const;

  bool has_attribute(const std::string& name) const;
  std::string attribute(const std::string& name) const;  // root attribute; throws if absent

  // Where the datasets' stored bytes lie in the file, sorted by offset: each chunk as stored
  // (filtered: its data and Fletcher32's 4 bytes), each contiguous dataset's block (none for an
  // empty one). The rest of the file is HDF5's metadata (superblock, object headers, B-trees,
  // heaps, attribute values) and free space. For tools/ckpt_sweep; needs HDF5 1.10.5.
  struct ByteRange {
    int64_t offset = 0, bytes = 0;
  };
  std::vector<ByteRange> dataset_storage() const;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int64_t file_id_ = -1;  // hid_t
};

// HDF5 files, groups, datasets, datatypes and attributes this process holds open: 0 between
// readers and writers, unless a failure inside HDF5 left something open (then a file opened
// again under the same path could be served from what HDF5 still holds of the old one).
int64_t hdf5_open_objects();

}  // namespace frugal
