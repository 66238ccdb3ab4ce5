// Tensor buffers and arenas.
#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/checked.h"
#include "core/log.h"

namespace frugal {

namespace {}  // namespace

Arena::Arena(std::string name, Device device, size_t limit_bytes)
    : name_(std::move(name)), device_(device) {
  stats_.limit_bytes = limit_bytes;
}

void* Arena::allocate(size_t bytes, const std::string& what) {
  if (stats_.limit_bytes && stats_.in_use_bytes + bytes > stats_.limit_bytes)
    fail("out of memory in ", name_, ": allocating ", format_bytes(bytes), " for ", what, " with ",
         format_bytes(stats_.in_use_bytes), " in use of a ", format_bytes(stats_.limit_bytes),
         " limit");
  void* ptr = raw_allocate(bytes, what);
  if (!ptr) fail("out of memory in ", name_, ": allocating ", format_bytes(bytes), " for ", what);
  stats_.in_use_bytes += bytes;
  if (stats_.in_use_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.in_use_bytes;
  return ptr;
}

void Arena::release(void* ptr, size_t bytes) {
  raw_release(ptr);
  stats_.in_use_bytes -= bytes;
}

void* Arena::raw_allocate(size_t bytes, const std::string& /*what*/) {
  // 64-byte alignment: whole cache lines, and any SIMD width.
  size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
}

void Arena::raw_release(void* ptr) { std::free(ptr); }

SubArena::SubArena(std::string name, Arena& parent)
    : Arena(std::move(name), parent.device()), parent_(parent) {}

SubArena::~SubArena() = default;

void* SubArena::raw_allocate(size_t bytes, const std::string& what) {
  void* ptr = parent_.allocate(bytes, what + " (" + name() + ")");
  sizes_.emplace(ptr, bytes);
  return ptr;
}

void SubArena::raw_release(void* ptr) {
  auto it = sizes_.find(ptr);
  FRUGAL_CHECK(it != sizes_.end(), "release of a block ", name(), " did not hand out");
  parent_.release(ptr, it->second);
  sizes_.erase(it);
}

Arena& host_arena() {
  static Arena arena("host memory", Device::cpu);
  return arena;
}

// Owns one allocation; not copyable, so exactly one release per allocate.
struct Tensor::Buffer {
  Buffer(Arena* arena, void* ptr, size_t bytes) : arena(arena), ptr(ptr), bytes(bytes) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { arena->release(ptr, bytes); }
  Arena* arena;
  void* ptr;
  size_t bytes;
};

std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    int64_t product = 0;
    if (!mul_fits(n, d, &product)) fail_mul_overflow(n, d, "tensor shape ", shape_string(shape));
    n = product;
  }
  return n;
}

size_t shape_bytes(const Shape& shape, DType dtype) {
  const auto numel = static_cast<size_t>(shape_numel(shape));
  size_t bytes = 0;
  if (!mul_fits(numel, dtype_bytes(dtype), &bytes))
    fail_mul_overflow(numel, dtype_bytes(dtype), "tensor shape ", shape_string(shape), " of ",
                      dtype_name(dtype), ": elements x bytes per element");
  return bytes;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Arena& arena) {
  for (int64_t d : shape)
    if (d < 0) fail("tensor shape ", shape_string(shape), " has a negative dimension");
  Tensor t;
  const size_t bytes = shape_bytes(shape, dtype);
  void* ptr = arena.allocate(bytes, "a " + dtype_name(dtype) + " tensor " + shape_string(shape));
  t.buffer_ = std::make_shared<Buffer>(&arena, ptr, bytes);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Arena& arena) {
  Tensor t = empty(shape, dtype, arena);
  t.fill_zero();
  return t;
}

Device Tensor::device() const { return arena().device(); }

Arena& Tensor::arena() const {
  FRUGAL_CHECK(buffer_, "undefined tensor has no arena");
  return *buffer_->arena;
}

int64_t Tensor::size(int64_t axis) const {
  int64_t n = ndim();
  if (axis < 0) axis += n;
  FRUGAL_CHECK(axis >= 0 && axis < n, "axis ", axis, " of a tensor of shape ",
               shape_string(shape_));
  return shape_[axis];
}

void* Tensor::raw() const {
  FRUGAL_CHECK(buffer_, "data of an undefined tensor");
  return static_cast<char*>(buffer_->ptr) + offset_bytes_;
}

Tensor Tensor::view(const Shape& shape) const {
  FRUGAL_CHECK(shape_numel(shape) == numel(), "view ", shape_string(shape_), " as ",
               shape_string(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  FRUGAL_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "rows [", begin, ", ",
               end, ") of a tensor of shape ", shape_string(shape_));
  Tensor t = *this;
  const size_t row_bytes = shape_bytes(Shape(shape_.begin() + 1, shape_.end()), dtype_);
  t.offset_bytes_ += static_cast<size_t>(begin) * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::clone(Arena& arena) const {
  Tensor t = empty(shape_, dtype_, arena);
  t.copy_from(*this);
  return t;
}

void Tensor::fill_zero() {
  FRUGAL_CHECK(device() == Device::cpu, "fill_zero of a device tensor goes through ops::");
  std::memset(raw(), 0, bytes());
}

void Tensor::copy_from(const Tensor& src) {
  FRUGAL_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy ", shape_string(src.shape_), " ",
               dtype_name(src.dtype_), " into ", shape_string(shape_), " ", dtype_name(dtype_));
  FRUGAL_CHECK(device() == Device::cpu && src.device() == Device::cpu,
               "copies to or from a device go through ops::");
  std::memcpy(raw(), src.raw(), bytes());
}

}  // namespace frugal
