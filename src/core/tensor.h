// Tensor: a dtype, a shape and a contiguous window into a reference-counted buffer that an
// Arena handed out. Arenas are accounting domains (host compute memory, offloaded state,
// device memory) that track bytes in use and the peak, and may refuse past a cap.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace frugal {

enum class Device : uint8_t { cpu, cuda };

struct MemoryStats {
  size_t in_use_bytes = 0;
  size_t peak_bytes = 0;
  size_t limit_bytes = 0;  // 0: no cap
};

class Arena {
 public:
  // limit_bytes = 0 means no cap. Allocations past the cap throw an Error that names `what`.
  Arena(std::string name, Device device, size_t limit_bytes = 0);
  virtual ~Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* allocate(size_t bytes, const std::string& what);
  void release(void* ptr, size_t bytes);

  const std::string& name() const { return name_; }
  Device device() const { return device_; }
  MemoryStats stats() const { return stats_; }
  void reset_peak() { stats_.peak_bytes = stats_.in_use_bytes; }
  void set_limit(size_t limit_bytes) { stats_.limit_bytes = limit_bytes; }

 protected:
  // `what` names the tensor, for the message of an arena that refuses.
  virtual void* raw_allocate(size_t bytes, const std::string& what);
  virtual void raw_release(void* ptr);

 private:
  std::string name_;
  Device device_;
  MemoryStats stats_;
};

// An accounting domain inside another arena: what it hands out is counted here and served
// (and counted, and capped) by the parent. One GPU's memory is one capped arena; the trainer
// counts parameters, gradients, optimizer state and gathered units apart inside it.
class SubArena : public Arena {
 public:
  SubArena(std::string name, Arena& parent);
  ~SubArena() override;
  Arena& parent() const { return parent_; }

 protected:
  void* raw_allocate(size_t bytes, const std::string& what) override;
  void raw_release(void* ptr) override;

 private:
  Arena& parent_;
  std::unordered_map<void*, size_t> sizes_;
};

// The arena of ordinary CPU tensors (activations, gathered weights, gradients on the CPU
// backend). Like malloc, it is process-wide.
Arena& host_arena();

using Shape = std::vector<int64_t>;
std::string shape_string(const Shape& shape);  // "[2, 3, 4]"
// The element count and the byte size of a shape; an Error naming the shape when either does
// not fit in 64 bits (checked, since shapes come from files and configuration).
int64_t shape_numel(const Shape& shape);
size_t shape_bytes(const Shape& shape, DType dtype);

class Tensor {
 public:
  Tensor() = default;  // an empty handle: defined() is false

  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Arena& arena = host_arena());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Arena& arena = host_arena());

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const;
  Arena& arena() const;
  const Shape& shape() const { return shape_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const;  // negative axis counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t bytes() const { return shape_bytes(shape_, dtype_); }

  void* raw() const;
  template <class T>
  T* data() const {
    check_element<T>();
    return static_cast<T*>(raw());
  }

  // Same elements, new shape (numel must match).
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) of the first axis: a contiguous window, shares the buffer.
  Tensor rows(int64_t begin, int64_t end) const;
  // A new buffer with the same contents.
  Tensor clone(Arena& arena = host_arena()) const;
  void fill_zero();
  void copy_from(const Tensor& src);  // same shape and dtype, any arenas

 private:
  struct Buffer;
  template <class T>
  void check_element() const;

  std::shared_ptr<Buffer> buffer_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<uint16_t>() {
  return DType::bf16;
}  // raw bf16 bits

template <class T>
void Tensor::check_element() const {
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (dtype_ != DType::bf16 && dtype_ != DType::f16)
      fail("tensor of dtype ", dtype_name(dtype_), " read as 16-bit");
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    if (dtype_bytes(dtype_) != 1) fail("tensor of dtype ", dtype_name(dtype_), " read as bytes");
  } else if constexpr (!std::is_same_v<T, void>) {
    if (dtype_ != dtype_of<T>())
      fail("tensor of dtype ", dtype_name(dtype_), " read as ", dtype_name(dtype_of<T>()));
  }
}

}  // namespace frugal
