// HDF5 tensor files over the HDF5 C API: RAII handles, the dtype <-> HDF5 type mapping, and
// the atomic write / verified read of checksummed datasets.
#include "ckpt/h5_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <type_traits>
#include <utility>

#include "ckpt/crc32c.h"
#include "core/error.h"
#include "core/regular_file.h"

namespace frugal {

static_assert(std::is_same_v<hid_t, int64_t>, "h5_file.h stores hid_t as int64_t");

namespace {

// Chunks of about this many bytes: small enough that a corrupt chunk is a small loss and the
// Fletcher32 pass stays cache-friendly, large enough that per-chunk overhead is negligible.
constexpr size_t kChunkTargetBytes = size_t(1) << 20;

// HDF5 prints its error stack to stderr on every failed call unless told not to. With a
// thread-safe libhdf5 the setting is per thread, so every entry point calls this.
void silence_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// HDF5 allocates its metadata cache (H5C_t, about a megabyte, mostly a hash table) zeroed from a
// free list on every file open and create. The library's default keeps at most 64 KiB per free
// list, so each close hands that megabyte back to the allocator and each open maps and zeroes it
// again: page faults that made an open of a small file cost 2 ms under AddressSanitizer (0.15 ms
// with the block kept). Keep up to 4 MiB on the regular free lists instead; the other limits are
// HDF5 1.10's defaults. Process-wide, set once.
void keep_metadata_cache_allocations() {
  static const bool done = [] {
    H5set_free_list_limits(4 << 20, 4 << 20, 4 << 20, 256 << 10, 16 << 20, 1 << 20);
    return true;
  }();
  (void)done;
}

// Closes an HDF5 object id when it goes out of scope.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  // Every HDF5 call clears the thread's error stack, so a close during unwinding would erase
  // the error being reported; keep it across the close.
  ~Handle() {
    if (id_ < 0) return;
    if (H5Eget_num(H5E_DEFAULT) > 0) {
      const hid_t pending = H5Eget_current_stack();
      closer_(id_);
      if (pending >= 0) H5Eset_current_stack(pending);
    } else {
      closer_(id_);
    }
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept
      : id_(std::exchange(other.id_, H5I_INVALID_HID)), closer_(other.closer_) {}

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_;
  Closer closer_;
};

// File access properties shared by the writer and the reader. HDF5 1.10 locks files with
// flock(), which some cluster file systems refuse; lock where possible and go on where not.
Handle file_access_properties() {
  keep_metadata_cache_allocations();
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  if (fapl.valid()) H5Pset_file_locking(fapl.get(), true, true);
#endif
  return fapl;
}

// The most specific message on the HDF5 error stack of this thread (e.g. "truncated file:
// eof = 1024, ..."), then clears the stack.
std::string hdf5_error_detail() {
  std::string detail;
  auto innermost = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    if (n == 0 && err->desc && *err->desc) *static_cast<std::string*>(data) = err->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &detail);
  H5Eclear2(H5E_DEFAULT);
  return detail;
}

std::string with_detail(const std::string& what) {
  const std::string detail = hdf5_error_detail();
  return detail.empty() ? what : what + " (HDF5: " + detail + ")";
}

template <class... Parts>
[[noreturn]] void fail_file(const std::string& path, const Parts&... what) {
  fail("checkpoint file ", path, ": ", what...);
}

template <class... Parts>
[[noreturn]] void fail_dataset(const std::string& path, const std::string& name,
                               const Parts&... what) {
  fail("checkpoint file ", path, ": dataset ", name, ": ", what...);
}

// "/model//w" -> "model/w"; the empty name and a trailing '/' are refused.
std::string dataset_key(const std::string& path, const std::string& name) {
  std::string key;
  for (size_t i = 0; i < name.size(); ++i)
    if (!(name[i] == '/' && (key.empty() || key.back() == '/'))) key += name[i];
  if (key.empty() || key.back() == '/')
    fail_file(path, "invalid tensor name '", name, "' (empty, or ends with '/')");
  return key;
}

// How a dtype is stored: the HDF5 type in the file and in memory (the same on little-endian
// hosts, converted by HDF5 otherwise).
struct Storage {
  hid_t file_type;
  hid_t mem_type;
};

Storage storage_of(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case DType::f64:
      return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE};
    case DType::bf16:
    case DType::f16:
      return {H5T_STD_U16LE, H5T_NATIVE_UINT16};
    case DType::e4m3:
    case DType::e5m2:
    case DType::u8:
      return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
    case DType::i32:
      return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    case DType::i64:
      return {H5T_STD_I64LE, H5T_NATIVE_INT64};
  }
  fail("internal check failed: unknown DType value ", static_cast<int>(dtype));
}

// Whether a dataset's file type holds `dtype` without conversion: same class, size and sign.
bool file_type_matches(hid_t file_type, DType dtype) {
  const hid_t expected = storage_of(dtype).file_type;
  if (H5Tget_class(file_type) != H5Tget_class(expected)) return false;
  if (H5Tget_size(file_type) != H5Tget_size(expected)) return false;
  if (H5Tget_class(file_type) == H5T_INTEGER && H5Tget_sign(file_type) != H5Tget_sign(expected))
    return false;
  return true;
}

// The dtype of a dataset written without a "dtype" attribute (by h5py, say), where the HDF5
// type alone says it; 16-bit and 8-bit floats cannot be told from integers and are refused.
bool infer_dtype(hid_t file_type, DType& out) {
  for (DType d : {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8}) {
    if (file_type_matches(file_type, d)) {
      out = d;
      return true;
    }
  }
  return false;
}

// Chunk dimensions of about kChunkTargetBytes: whole trailing axes while they fit, then as many
// slices of the next axis as fit, then 1 for the leading axes.
std::vector<hsize_t> chunk_dims(const Shape& shape, size_t element_bytes) {
  std::vector<hsize_t> chunk(shape.size(), 1);
  size_t inner_bytes = element_bytes;
  for (size_t i = shape.size(); i-- > 0;) {
    const size_t dim = static_cast<size_t>(shape[i]);
    if (inner_bytes * dim <= kChunkTargetBytes) {
      chunk[i] = dim;
      inner_bytes *= dim;
    } else {
      chunk[i] = std::max<size_t>(1, kChunkTargetBytes / inner_bytes);
      break;
    }
  }
  return chunk;
}

// A string attribute as a fixed-length UTF-8 string of exactly its bytes (NUL-padded; one NUL
// for the empty string, as HDF5 has no strings of size 0). Not variable-length: those live in
// the file's global heap, whose parser in HDF5 1.10 loops on some damaged files (found by
// fuzzing), and a file without variable-length data has no global heap at all. h5py reads it
// as bytes. Replaces an existing attribute of the same name.
bool write_string_attribute(hid_t object, const std::string& name, const std::string& value) {
  if (H5Aexists(object, name.c_str()) > 0 && H5Adelete(object, name.c_str()) < 0) return false;
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!type.valid() || H5Tset_size(type.get(), std::max<size_t>(1, value.size())) < 0 ||
      H5Tset_strpad(type.get(), H5T_STR_NULLPAD) < 0 || H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
    return false;
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
              H5Aclose);
  if (!attr.valid()) return false;
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  return H5Awrite(attr.get(), type.get(), padded.data()) >= 0;
}

// Reads a string attribute, fixed-length (trailing NULs dropped) or variable-length (as frugal
// wrote them before 2026-12-02; still read, from the global heap).
bool read_string_attribute(hid_t object, const std::string& name, std::string& out) {
  Handle attr(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  Handle file_type(H5Aget_type(attr.get()), H5Tclose);
  if (!file_type.valid() || H5Tget_class(file_type.get()) != H5T_STRING) return false;
  Handle space(H5Aget_space(attr.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return false;
  Handle mem_type(H5Tcopy(H5T_C_S1), H5Tclose);
  // HDF5 refuses to convert between character sets: read in the file's (ASCII or UTF-8).
  if (H5Tset_cset(mem_type.get(), H5Tget_cset(file_type.get())) < 0) return false;
  if (H5Tis_variable_str(file_type.get()) > 0) {
    if (H5Tset_size(mem_type.get(), H5T_VARIABLE) < 0) return false;
    char* text = nullptr;
    if (H5Aread(attr.get(), mem_type.get(), &text) < 0) return false;
    out = text ? text : "";
    H5free_memory(text);
    return true;
  }
  const size_t size = H5Tget_size(file_type.get());
  // A damaged datatype can claim any size: no attribute is longer than its file.
  Handle file(H5Iget_file_id(object), H5Fclose);
  hsize_t file_bytes = 0;
  if (!file.valid() || H5Fget_filesize(file.get(), &file_bytes) < 0 || size > file_bytes)
    return false;
  if (size == 0 || H5Tset_size(mem_type.get(), size) < 0 ||
      H5Tset_strpad(mem_type.get(), H5T_STR_NULLPAD) < 0)
    return false;
  std::string text(size, '\0');
  if (H5Aread(attr.get(), mem_type.get(), text.data()) < 0) return false;
  text.erase(std::find(text.begin(), text.end(), '\0'), text.end());
  out = std::move(text);
  return true;
}

bool write_u32_attribute(hid_t object, const std::string& name, uint32_t value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(
      H5Acreate2(object, name.c_str(), H5T_STD_U32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
      H5Aclose);
  return attr.valid() && H5Awrite(attr.get(), H5T_NATIVE_UINT32, &value) >= 0;
}

bool read_u32_attribute(hid_t object, const std::string& name, uint32_t& value) {
  Handle attr(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  Handle space(H5Aget_space(attr.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return false;
  return H5Aread(attr.get(), H5T_NATIVE_UINT32, &value) >= 0;
}

std::string hex32(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", v);
  return text;
}

// fsync a file or directory by path; false (with errno) on failure.
bool fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return ok;
}

// Whether a link path exists, checking each group on the way (H5Lexists itself fails when an
// intermediate group is missing).
bool link_exists(hid_t file, const std::string& key) {
  size_t pos = 0;
  while (true) {
    pos = key.find('/', pos);
    const std::string prefix = key.substr(0, pos);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
    ++pos;
  }
}

Handle open_dataset(hid_t file, const std::string& path, const std::string& key) {
  if (!link_exists(file, key)) {
    H5Eclear2(H5E_DEFAULT);
    fail_dataset(path, key, "not found");
  }
  Handle dataset(H5Dopen2(file, key.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset.valid()) fail_dataset(path, key, with_detail("cannot open (not a dataset?)"));
  return dataset;
}

Shape dataset_shape(hid_t dataset, const std::string& path, const std::string& key) {
  Handle space(H5Dget_space(dataset), H5Sclose);
  const int rank = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (rank < 0) fail_dataset(path, key, with_detail("cannot read the dataspace"));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0)
    fail_dataset(path, key, with_detail("cannot read the dataspace"));
  return Shape(dims.begin(), dims.end());
}

DType dataset_dtype(hid_t dataset, const std::string& path, const std::string& key) {
  Handle file_type(H5Dget_type(dataset), H5Tclose);
  if (!file_type.valid()) fail_dataset(path, key, with_detail("cannot read the element type"));
  DType dtype = DType::f32;
  std::string name;
  if (H5Aexists(dataset, "dtype") > 0) {
    if (!read_string_attribute(dataset, "dtype", name))
      fail_dataset(path, key, with_detail("unreadable 'dtype' attribute"));
    try {
      dtype = dtype_from_name(name);
    } catch (const Error& e) {
      fail_dataset(path, key, e.what());
    }
    if (!file_type_matches(file_type.get(), dtype))
      fail_dataset(path, key, "the 'dtype' attribute says ", name,
                   " but the stored element type does not match it");
  } else if (!infer_dtype(file_type.get(), dtype)) {
    fail_dataset(path, key,
                 "no 'dtype' attribute, and the element type is not f32, f64, i32, "
                 "i64 or u8");
  }
  return dtype;
}

void read_checked(hid_t file, hid_t dataset, const std::string& path, const std::string& key,
                  const Tensor& out) {
  if (out.device() != Device::cpu) fail_dataset(path, key, "can only be read into host memory");
  // HDF5 1.10 allocates a buffer of a filtered chunk's stored size, as the chunk index gives it,
  // before reading the chunk: a damaged size made it ask for gigabytes (found by fuzzing). No
  // dataset's stored bytes can exceed the file's.
  hsize_t file_bytes = 0;
  if (H5Fget_filesize(file, &file_bytes) < 0)
    fail_dataset(path, key, with_detail("cannot read the file's size"));
  const hsize_t stored_bytes = H5Dget_storage_size(dataset);
  if (stored_bytes > file_bytes)
    fail_dataset(path, key, "damaged: its stored size says ", stored_bytes,
                 " bytes, more than the file's ", file_bytes);
  uint32_t stored = 0;
  if (!read_u32_attribute(dataset, "crc32c", stored))
    fail_dataset(path, key, with_detail("missing or unreadable 'crc32c' attribute"));
  if (out.numel() > 0 && H5Dread(dataset, storage_of(out.dtype()).mem_type, H5S_ALL, H5S_ALL,
                                 H5P_DEFAULT, out.raw()) < 0)
    fail_dataset(path, key, with_detail("cannot read the data (corrupt or truncated file?)"));
  const uint32_t computed = crc32c(out.raw(), out.bytes());
  if (computed != stored)
    fail_dataset(path, key, "checksum mismatch (stored ", hex32(stored), ", computed ",
                 hex32(computed), ")");
}

}  // namespace

// --- H5Writer ---------------------------------------------------------------------------------

H5Writer::H5Writer(const std::string& path) : path_(path), tmp_path_(path + ".tmp") {
  silence_hdf5();
  Handle fapl = file_access_properties();
  // The 1.8 file format at least (compact groups, dense attribute storage); files stay
  // readable by any HDF5 1.10 reader.
  if (!fapl.valid() || H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V110) < 0)
    fail_file(path_, with_detail("cannot set up the HDF5 file access properties"));
  file_id_ = H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (file_id_ < 0)
    fail_file(path_, with_detail("cannot create " + tmp_path_ +
                                 " (directory missing or not "
                                 "writable?)"));
}

H5Writer::~H5Writer() { abandon(); }

H5Writer::H5Writer(H5Writer&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)),
      file_id_(std::exchange(other.file_id_, -1)) {}

H5Writer& H5Writer::operator=(H5Writer&& other) noexcept {
  if (this != &other) {
    abandon();
    path_ = std::move(other.path_);
    tmp_path_ = std::move(other.tmp_path_);
    file_id_ = std::exchange(other.file_id_, -1);
  }
  return *this;
}

void H5Writer::abandon() noexcept {
  if (file_id_ < 0) return;
  silence_hdf5();
  H5Fclose(file_id_);
  file_id_ = -1;
  std::remove(tmp_path_.c_str());
}

void H5Writer::write_tensor(const std::string& name, const Tensor& tensor) {
  silence_hdf5();
  if (file_id_ < 0) fail_dataset(path_, name, "write after close()");
  const std::string key = dataset_key(path_, name);
  if (!tensor.defined()) fail_dataset(path_, key, "the tensor is undefined");
  if (tensor.device() != Device::cpu) fail_dataset(path_, key, "can only write host tensors");
  const Shape& shape = tensor.shape();
  const Storage storage = storage_of(tensor.dtype());

  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(shape.empty()
                   ? H5Screate(H5S_SCALAR)
                   : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
               H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  if (!space.valid() || !dcpl.valid() || !lcpl.valid() ||
      H5Pset_create_intermediate_group(lcpl.get(), 1) < 0)
    fail_dataset(path_, key, with_detail("cannot set up the dataset " + shape_string(shape)));
  // Filters need chunked storage, which HDF5 allows neither for scalars nor for empty arrays;
  // those stay contiguous and rely on the CRC32C alone.
  if (!shape.empty() && tensor.numel() > 0) {
    const std::vector<hsize_t> chunk = chunk_dims(shape, dtype_bytes(tensor.dtype()));
    if (H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) < 0 ||
        H5Pset_fletcher32(dcpl.get()) < 0)
      fail_dataset(path_, key, with_detail("cannot set up chunking and Fletcher32"));
  }
  Handle dataset(H5Dcreate2(file_id_, key.c_str(), storage.file_type, space.get(), lcpl.get(),
                            dcpl.get(), H5P_DEFAULT),
                 H5Dclose);
  if (!dataset.valid())
    fail_dataset(path_, key, with_detail("cannot create the dataset (name already used?)"));
  if (tensor.numel() > 0 &&
      H5Dwrite(dataset.get(), storage.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.raw()) < 0)
    fail_dataset(path_, key, with_detail("cannot write the data (disk full?)"));
  if (!write_string_attribute(dataset.get(), "dtype", dtype_name(tensor.dtype())) ||
      !write_u32_attribute(dataset.get(), "crc32c", crc32c(tensor.raw(), tensor.bytes())))
    fail_dataset(path_, key, with_detail("cannot write the dataset's attributes"));
}

void H5Writer::write_attribute(const std::string& name, const std::string& value) {
  silence_hdf5();
  if (file_id_ < 0) fail_file(path_, "attribute ", name, ": write after close()");
  if (name.empty()) fail_file(path_, "empty attribute name");
  if (!write_string_attribute(file_id_, name, value))
    fail_file(path_, with_detail("cannot write attribute " + name));
}

void H5Writer::close() {
  silence_hdf5();
  if (file_id_ < 0) fail_file(path_, "close() called twice");
  const hid_t file = std::exchange(file_id_, -1);
  if (H5Fclose(file) < 0) {
    const std::string what = with_detail("cannot close " + tmp_path_ + " (disk full?)");
    std::remove(tmp_path_.c_str());
    fail_file(path_, what);
  }
  // The data must be on disk before the rename makes the file visible under its final name.
  if (!fsync_path(tmp_path_, false)) {
    const std::string error = std::strerror(errno);
    std::remove(tmp_path_.c_str());
    fail_file(path_, "cannot fsync ", tmp_path_, ": ", error);
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const std::string error = std::strerror(errno);
    std::remove(tmp_path_.c_str());
    fail_file(path_, "cannot rename ", tmp_path_, " to it: ", error);
  }
  // And the rename itself must survive a crash: fsync the directory entry.
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  if (!fsync_path(dir, true))
    fail_file(path_, "cannot fsync the directory ", dir, ": ", std::strerror(errno));
}

int64_t hdf5_open_objects() {
  silence_hdf5();
  return int64_t(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL));
}

// --- H5Reader ---------------------------------------------------------------------------------

H5Reader::H5Reader(const std::string& path) : path_(path) {
  silence_hdf5();
  // HDF5 opens the file itself, with a plain open(), which a FIFO would block forever.
  require_regular_file(path_, "checkpoint file");
  const htri_t is_hdf5 = H5Fis_hdf5(path_.c_str());
  if (is_hdf5 == 0) fail_file(path_, "not an HDF5 file");
  Handle fapl = file_access_properties();
  file_id_ = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (file_id_ < 0) fail_file(path_, with_detail("cannot open (corrupt or truncated?)"));
}

H5Reader::~H5Reader() {
  if (file_id_ >= 0) {
    silence_hdf5();
    H5Fclose(file_id_);
  }
}

H5Reader::H5Reader(H5Reader&& other) noexcept
    : path_(std::move(other.path_)), file_id_(std::exchange(other.file_id_, -1)) {}

H5Reader& H5Reader::operator=(H5Reader&& other) noexcept {
  if (this != &other) {
    if (file_id_ >= 0) H5Fclose(file_id_);
    path_ = std::move(other.path_);
    file_id_ = std::exchange(other.file_id_, -1);
  }
  return *this;
}

std::vector<std::string> H5Reader::tensor_names() const {
  silence_hdf5();
  std::vector<std::string> names;
  auto visit = [](hid_t group, const char* name, const H5L_info_t* info, void* data) -> herr_t {
    if (info->type != H5L_TYPE_HARD) return 0;
    Handle object(H5Oopen(group, name, H5P_DEFAULT), H5Oclose);
    if (!object.valid()) return -1;
    if (H5Iget_type(object.get()) == H5I_DATASET)
      static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  // In the file's own order, sorted below: HDF5 1.10's sorted iteration over a dense group
  // builds a table of its links and, when damaged metadata stops that half-way, frees the
  // entries it never filled (uninitialized pointers: a crash, or a corrupt heap).
  if (H5Lvisit(file_id_, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &names) < 0)
    fail_file(path_, with_detail("cannot list the datasets"));
  std::sort(names.begin(), names.end());
  return names;
}

bool H5Reader::has(const std::string& name) const {
  silence_hdf5();
  const std::string key = dataset_key(path_, name);
  if (!link_exists(file_id_, key)) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  Handle object(H5Oopen(file_id_, key.c_str(), H5P_DEFAULT), H5Oclose);
  const bool is_dataset = object.valid() && H5Iget_type(object.get()) == H5I_DATASET;
  H5Eclear2(H5E_DEFAULT);
  return is_dataset;
}

Shape H5Reader::shape_of(const std::string& name) const {
  silence_hdf5();
  const std::string key = dataset_key(path_, name);
  Handle dataset = open_dataset(file_id_, path_, key);
  return dataset_shape(dataset.get(), path_, key);
}

DType H5Reader::dtype_of(const std::string& name) const {
  silence_hdf5();
  const std::string key = dataset_key(path_, name);
  Handle dataset = open_dataset(file_id_, path_, key);
  return dataset_dtype(dataset.get(), path_, key);
}

Tensor H5Reader::read_tensor(const std::string& name, Arena& arena) const {
  silence_hdf5();
  const std::string key = dataset_key(path_, name);
  Handle dataset = open_dataset(file_id_, path_, key);
  const DType dtype = dataset_dtype(dataset.get(), path_, key);
  const Shape shape = dataset_shape(dataset.get(), path_, key);
  if (arena.device() != Device::cpu)
    fail_dataset(path_, key, "can only be read into host memory, not ", arena.name());
  Tensor tensor = Tensor::empty(shape, dtype, arena);
  read_checked(file_id_, dataset.get(), path_, key, tensor);
  return tensor;
}

void H5Reader::read_into(const std::string& name, const Tensor& out) const {
  silence_hdf5();
  const std::string key = dataset_key(path_, name);
  Handle dataset = open_dataset(file_id_, path_, key);
  const DType dtype = dataset_dtype(dataset.get(), path_, key);
  const Shape shape = dataset_shape(dataset.get(), path_, key);
  if (!out.defined() || dtype != out.dtype() || shape != out.shape())
    fail_dataset(path_, key, "holds ", dtype_name(dtype), " ", shape_string(shape), ", read into ",
                 out.defined() ? dtype_name(out.dtype()) + " " + shape_string(out.shape())
                               : std::string("an undefined tensor"));
  read_checked(file_id_, dataset.get(), path_, key, out);
}

bool H5Reader::has_attribute(const std::string& name) const {
  silence_hdf5();
  const bool exists = H5Aexists(file_id_, name.c_str()) > 0;
  H5Eclear2(H5E_DEFAULT);
  return exists;
}

std::string H5Reader::attribute(const std::string& name) const {
  silence_hdf5();
  if (!has_attribute(name)) fail_file(path_, "no attribute '", name, "'");
  std::string value;
  if (!read_string_attribute(file_id_, name, value))
    fail_file(path_, with_detail("attribute '" + name + "' is not a readable string"));
  return value;
}

std::vector<H5Reader::ByteRange> H5Reader::dataset_storage() const {
  silence_hdf5();
  std::vector<ByteRange> ranges;
  for (const std::string& name : tensor_names()) {
    const std::string key = dataset_key(path_, name);
    Handle dataset = open_dataset(file_id_, path_, key);
    Handle dcpl(H5Dget_create_plist(dataset.get()), H5Pclose);
    const H5D_layout_t layout = dcpl.valid() ? H5Pget_layout(dcpl.get()) : H5D_LAYOUT_ERROR;
    if (layout == H5D_CONTIGUOUS) {
      const haddr_t offset = H5Dget_offset(dataset.get());
      const hsize_t bytes = H5Dget_storage_size(dataset.get());
      if (offset != HADDR_UNDEF && bytes > 0) ranges.push_back({int64_t(offset), int64_t(bytes)});
    } else if (layout == H5D_CHUNKED) {
#if H5_VERSION_GE(1, 10, 5)
      // HDF5 1.10 wants the dataset's own dataspace here, not H5S_ALL.
      Handle space(H5Dget_space(dataset.get()), H5Sclose);
      hsize_t chunks = 0;
      if (!space.valid() || H5Dget_num_chunks(dataset.get(), space.get(), &chunks) < 0)
        fail_dataset(path_, key, with_detail("cannot count its chunks"));
      for (hsize_t i = 0; i < chunks; ++i) {
        haddr_t offset = HADDR_UNDEF;
        hsize_t bytes = 0;
        if (H5Dget_chunk_info(dataset.get(), space.get(), i, nullptr, nullptr, &offset, &bytes) < 0)
          fail_dataset(path_, key, with_detail("cannot locate chunk " + std::to_string(i)));
        if (offset != HADDR_UNDEF && bytes > 0) ranges.push_back({int64_t(offset), int64_t(bytes)});
      }
#else
      fail_dataset(path_, key, "locating chunks needs HDF5 1.10.5 or later");
#endif
    } else if (layout != H5D_COMPACT) {  // compact data lies in the object header: metadata
      fail_dataset(path_, key, with_detail("cannot read its storage layout"));
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  return ranges;
}

}  // namespace frugal
