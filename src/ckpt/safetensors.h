// safetensors files (Hugging Face's weight format): memory-mapped reads of whole tensors or of
// a range of rows, converted to f32; writes in f32 or bf16; and sharded checkpoints, whose
// model.safetensors.index.json maps every tensor name to the shard file that holds it.
//
// On disk (https://github.com/huggingface/safetensors): an 8-byte little-endian header length
// N, N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
// "__metadata__": {string: string}}, padded with spaces so the data starts 8-byte aligned,
// then the data; offsets count from the start of the data, tensors are row-major.
//
// Every header is validated when the file is opened (offsets inside the file, sizes that
// match shape x dtype, no overlaps), so a truncated or corrupt file fails at once with a
// frugal::Error naming the file and the tensor, never with a read past the mapping.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace frugal {

// One tensor's header entry. `dtype` is the safetensors name ("F32", "BF16", "I64", ...).
struct SafetensorsEntry {
  std::string dtype;
  Shape shape;
  size_t begin_bytes = 0;  // offsets from the start of the data section
  size_t end_bytes = 0;
};

// The frugal dtype of a safetensors dtype name that frugal reads as float (F64, F32, F16,
// BF16, F8_E4M3, F8_E5M2); throws Error for any other name.
DType safetensors_float_dtype(const std::string& name);

// A read-only, memory-mapped safetensors file. Reading touches only the pages of the rows
// asked for, so a rank that loads its shard of a tensor reads only its shard.
class SafetensorsFile {
 public:
  // Opens, maps and validates `path`; throws Error naming the file (and the tensor) when it
  // is missing, truncated, or its header is malformed.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> tensor_names() const;  // sorted
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // Throws Error naming the file and the tensor when absent.
  const SafetensorsEntry& entry(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Rows [row_begin, row_end) of the first axis as a new f32 tensor of shape
  // [row_end - row_begin, rest of the shape...] (a 0-d tensor has one row).
  Tensor read_rows(const std::string& name, int64_t row_begin, int64_t row_end,
                   Arena& arena = host_arena()) const;
  // The whole tensor as f32.
  Tensor read(const std::string& name, Arena& arena = host_arena()) const;
  // The same rows into an existing f32 host tensor of exactly that many elements.
  void read_rows_into(const std::string& name, int64_t row_begin, int64_t row_end,
                      const Tensor& out) const;

 private:
  std::string path_;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  const uint8_t* data_ = nullptr;  // start of the data section inside the mapping
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// A model's weights in one directory: either model.safetensors, or the shards named by
// model.safetensors.index.json. Shards are opened (and validated) when the set is opened, so
// a missing shard is reported at once, naming the index, the shard and a tensor it holds.
class SafetensorsSet {
 public:
  // `dir` holds model.safetensors.index.json (preferred when both exist) or model.safetensors.
  explicit SafetensorsSet(const std::string& dir);

  std::vector<std::string> tensor_names() const;  // sorted
  bool has(const std::string& name) const { return file_of_.count(name) != 0; }
  // The file that holds `name`; throws Error naming the directory and tensor when absent.
  const SafetensorsFile& file_of(const std::string& name) const;
  const std::string& dir() const { return dir_; }
  // "DIR/model.safetensors" or "DIR/model.safetensors.index.json", for messages.
  const std::string& description() const { return description_; }

 private:
  std::string dir_;
  std::string description_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> file_of_;
};

// Writes one safetensors file, tensor by tensor, so that a model can be exported while its
// weights arrive one unit at a time. The header (every name and shape, sorted by name) is
// fixed at construction; write() may then come in any order, once per tensor.
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    Shape shape;
  };
  // Creates "<path>.tmp"; `dtype` (f32, bf16 or f16) is the on-disk type of every tensor.
  SafetensorsWriter(const std::string& path, const std::vector<Spec>& specs, DType dtype,
                    const std::map<std::string, std::string>& metadata = {});
  // Without close(), the temporary file is removed.
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // `values`: an f32 host tensor of the declared shape, converted to the file's dtype.
  void write(const std::string& name, const Tensor& values);
  // Checks every tensor was written, fsyncs, and renames "<path>.tmp" to `path`.
  void close();

  // Bytes the file will have.
  size_t file_bytes() const { return file_bytes_; }

 private:
  std::string path_;
  std::string tmp_path_;
  DType dtype_;
  int fd_ = -1;
  size_t data_start_ = 0;
  size_t file_bytes_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, bool> written_;
};

// Convenience: every (name, f32 tensor) pair into one file.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace frugal
