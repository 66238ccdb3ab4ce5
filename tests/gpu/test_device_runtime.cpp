// The device runtime: the caching allocator reuses blocks, refuses past its cap with a message
// that says what did not fit and stays usable, keeps peaks, trims; copies round-trip through
// device and pinned memory; streams and events order and time work; a stream calls a host
// function once its earlier work is done.
#include <cstdio>
#include <cstring>
#include <future>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/device.h"

using namespace frugal;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

bool have_gpu() {
  if (device_count() > 0) return true;
  std::printf("no GPU: skipping\n");
  return false;
}

Tensor host_ramp(const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = 0.5f * float(i) - 7.0f;
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

}  // namespace

TEST_CASE("device arena reuses freed blocks of the same size class", "[gpu]") {
  if (!have_gpu()) return;
  DeviceArena arena(0, 0, "test device memory");
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1000}, DType::f32, arena);  // 4000 B: the 4096 B class
    first = t.raw();
    CHECK(t.device() == Device::cuda);
  }
  CachingStats s = arena.caching_stats();
  CHECK(s.in_use_bytes == 0);
  CHECK(s.cached_bytes == 4096);
  CHECK(s.reserved_bytes == 4096);
  {
    Tensor t = Tensor::empty({1001}, DType::f32, arena);  // 4004 B: the same class
    CHECK(t.raw() == first);
  }
  s = arena.caching_stats();
  CHECK(s.driver_allocations == 1);
  CHECK(s.cache_hits == 1);
  {
    // A large block: rounded to 2 MiB steps, reused as well.
    Tensor a = Tensor::empty({int64_t(3 * kMiB)}, DType::u8, arena);
    void* big = a.raw();
    a = Tensor();
    Tensor b = Tensor::empty({int64_t(3 * kMiB + 12345)}, DType::u8, arena);
    CHECK(b.raw() == big);
  }
  s = arena.caching_stats();
  CHECK(s.driver_allocations == 2);
  CHECK(s.cache_hits == 2);
  CHECK(s.reserved_bytes == 4096 + 4 * kMiB);
}

TEST_CASE("device arena refuses past its cap, says what did not fit, and stays usable", "[gpu]") {
  if (!have_gpu()) return;
  DeviceArena arena(0, 8 * kMiB, "capped device memory");
  Tensor held = Tensor::empty({int64_t(6 * kMiB)}, DType::u8, arena);
  std::string message;
  try {
    Tensor t = Tensor::empty({int64_t(kMiB)}, DType::f32, arena);  // 4 MiB
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("capped device memory") != std::string::npos);
  CHECK(message.find("f32 tensor [1048576]") != std::string::npos);  // what
  CHECK(message.find("4 MiB") != std::string::npos);                 // its size
  CHECK(message.find("6 MiB") != std::string::npos);                 // in use
  CHECK(message.find("8 MiB") != std::string::npos);                 // the cap
  CHECK(arena.caching_stats().in_use_bytes == 6 * kMiB);

  // Usable after the refusal: with the 6 MiB freed (and cached), 4 MiB fits once the cache
  // has been given back.
  held = Tensor();
  CHECK(arena.caching_stats().cached_bytes == 6 * kMiB);
  Tensor t = Tensor::empty({int64_t(kMiB)}, DType::f32, arena);
  CachingStats s = arena.caching_stats();
  CHECK(s.reserved_bytes == 4 * kMiB);
  CHECK(s.cached_bytes == 0);
  CHECK(s.trims == 1);
  CHECK(s.reserved_bytes <= s.limit_bytes);
}

TEST_CASE("device arena counts whole blocks against its cap", "[gpu]") {
  if (!have_gpu()) return;
  // 4.5 MiB asked for fits a 5 MiB cap, but its block is 6 MiB.
  DeviceArena arena(0, 5 * kMiB, "capped device memory");
  std::string message;
  try {
    Tensor t = Tensor::empty({int64_t(4 * kMiB + kMiB / 2)}, DType::u8, arena);
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("6 MiB") != std::string::npos);    // the block
  CHECK(message.find("4.5 MiB") != std::string::npos);  // the request
  CHECK(message.find("reserved") != std::string::npos);
  CHECK(message.find("cap 5 MiB") != std::string::npos);
  CHECK(arena.caching_stats().reserved_bytes == 0);
  Tensor small = Tensor::empty({int64_t(kMiB)}, DType::f32, arena);  // 4 MiB: fits
  CHECK(arena.caching_stats().in_use_bytes == 4 * kMiB);
}

TEST_CASE("device arena keeps peaks and trims its cache", "[gpu]") {
  if (!have_gpu()) return;
  DeviceArena arena(0, 0);
  {
    Tensor a = Tensor::empty({int64_t(kMiB)}, DType::u8, arena);
    Tensor b = Tensor::empty({int64_t(2 * kMiB)}, DType::u8, arena);
  }
  Tensor c = Tensor::empty({512}, DType::u8, arena);
  CachingStats s = arena.caching_stats();
  CHECK(s.in_use_bytes == 512);
  CHECK(s.peak_in_use_bytes == 3 * kMiB);
  // 1 MiB is the largest small class, 2 MiB the smallest large one: no rounding here.
  CHECK(s.reserved_bytes == 3 * kMiB + 512);
  CHECK(s.peak_reserved_bytes == 3 * kMiB + 512);
  arena.trim();
  s = arena.caching_stats();
  CHECK(s.cached_bytes == 0);
  CHECK(s.reserved_bytes == 512);
  CHECK(s.peak_reserved_bytes == 3 * kMiB + 512);
  arena.reset_peaks();
  s = arena.caching_stats();
  CHECK(s.peak_in_use_bytes == 512);
  CHECK(s.peak_reserved_bytes == 512);
  CHECK(arena.usage_report().find("512 B in use") != std::string::npos);
}

TEST_CASE("copies round-trip host, device and pinned memory", "[gpu]") {
  if (!have_gpu()) return;
  DeviceContext context(0);
  const Stream& stream = context.compute();
  const Tensor host = host_ramp({37, 53});
  Tensor device = clone_async(host, context.device_memory(), stream);
  Tensor device2 = Tensor::empty({37, 53}, DType::f32, context.device_memory());
  copy_async(device2, device, stream);  // device to device
  Tensor pinned = Tensor::empty({37, 53}, DType::f32, context.pinned_memory());
  copy_async(pinned, device2, stream);
  stream.synchronize();
  CHECK(pinned.device() == Device::cpu);
  CHECK(same_bytes(pinned, host));
  CHECK(same_bytes(to_host(device2, stream), host));

  // A row window of a device tensor, and bf16.
  Tensor rows = to_host(device.rows(3, 10), stream);
  CHECK(std::memcmp(rows.raw(), host.rows(3, 10).raw(), rows.bytes()) == 0);
  Tensor bf = Tensor::empty({5, 7}, DType::bf16);
  for (int64_t i = 0; i < bf.numel(); ++i) bf.data<uint16_t>()[i] = float_to_bf16(float(i) - 3);
  CHECK(same_bytes(to_host(clone_async(bf, context.device_memory(), stream), stream), bf));

  Tensor zeroed = clone_async(host, context.device_memory(), stream);
  fill_zero_async(zeroed, stream);
  const Tensor back = to_host(zeroed, stream);
  CHECK(same_bytes(back, Tensor::zeros({37, 53})));

  // Shape and dtype are checked.
  Tensor wrong_shape = Tensor::empty({53, 37}, DType::f32, context.device_memory());
  CHECK_THROWS_AS(copy_async(wrong_shape, host, stream), Error);
  Tensor wrong_dtype = Tensor::empty({37, 53}, DType::i32, context.device_memory());
  CHECK_THROWS_AS(copy_async(wrong_dtype, host, stream), Error);
}

TEST_CASE("pinned host arena caches, caps and is host memory", "[gpu]") {
  if (!have_gpu()) return;
  PinnedHostArena arena(4 * kMiB, "test pinned memory");
  void* first = nullptr;
  {
    Tensor t = Tensor::zeros({1000}, DType::f32, arena);  // plain host code can touch it
    CHECK(t.device() == Device::cpu);
    t.data<float>()[999] = 1.0f;
    first = t.raw();
  }
  {
    Tensor t = Tensor::empty({1000}, DType::f32, arena);
    CHECK(t.raw() == first);
  }
  CHECK(arena.caching_stats().cache_hits == 1);
  CHECK_THROWS_AS(Tensor::empty({int64_t(5 * kMiB)}, DType::u8, arena), Error);
  Tensor fits = Tensor::empty({int64_t(3 * kMiB)}, DType::u8, arena);
  CHECK(arena.caching_stats().in_use_bytes == 3 * kMiB);
}

TEST_CASE("streams and events order and time work", "[gpu]") {
  if (!have_gpu()) return;
  DeviceContext context(0);
  CHECK(context.device() == 0);
  CHECK(device_for_local_rank(device_count()) == 0);
  Event start(true), stop(true);
  const Tensor host = host_ramp({int64_t(4 * kMiB)});
  Tensor device = Tensor::empty(host.shape(), DType::f32, context.device_memory());
  start.record(context.compute());
  copy_async(device, host, context.compute());
  stop.record(context.compute());
  // The communication stream waits for the compute stream's copy, then copies back.
  Tensor pinned = Tensor::empty(host.shape(), DType::f32, context.pinned_memory());
  context.comm().wait(stop);
  copy_async(pinned, device, context.comm());
  context.comm().synchronize();
  CHECK(stop.done());
  CHECK(stop.elapsed_ms_since(start) >= 0.0f);
  CHECK(same_bytes(pinned, host));
  context.comm().wait(context.compute());
  context.synchronize();
}

TEST_CASE("a stream calls a host function once the work queued before it is done", "[gpu]") {
  if (!have_gpu()) return;
  DeviceContext context(0);
  const Tensor host = host_ramp({int64_t(16 * kMiB)});
  Tensor device = Tensor::empty(host.shape(), DType::f32, context.device_memory());
  Tensor pinned = Tensor::empty(host.shape(), DType::f32, context.pinned_memory());
  // Up on the compute stream, down on the communication stream after it (as ops::SideCopy
  // does), then the function, which reads the download on CUDA's callback thread: the host
  // never synchronizes, yet the function sees every byte.
  copy_async(device, host, context.compute());
  context.comm().wait(context.compute());
  copy_async(pinned, device, context.comm());
  std::promise<bool> seen;
  std::future<bool> result = seen.get_future();
  context.comm().call_when_reached([&] { seen.set_value(same_bytes(pinned, host)); });
  CHECK(result.get());
  // What it throws stays on the callback thread; later work on the stream still runs.
  context.comm().call_when_reached([] { throw std::runtime_error("lost"); });
  std::promise<void> after;
  context.comm().call_when_reached([&] { after.set_value(); });
  after.get_future().get();
  context.synchronize();
}
