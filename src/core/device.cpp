// The CUDA device runtime: caching arenas (device and pinned host), streams, events, copies.
#include "core/device.h"

#ifdef FRUGAL_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "core/log.h"

namespace frugal {

namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    fail("CUDA error in ", what, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
         ")");
}

// Size classes: small blocks in 512-byte steps, large ones in 2 MiB steps, so that the
// buffers a training step asks for again and again (same shapes every step) land in the
// same free list, while the rounding wastes at most 2 MiB on a large block.
constexpr size_t kSmallStep = 512;
constexpr size_t kLargeStep = size_t(2) << 20;
constexpr size_t kSmallLimit = size_t(1) << 20;

size_t size_class(size_t bytes) {
  if (bytes == 0) return kSmallStep;
  const size_t step = bytes <= kSmallLimit ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

// Makes `device` current for the calling thread while alive, then restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky-free error and say so
    return 0;
  }
  return count;
}

// ---- CachingArena ------------------------------------------------------------------------

struct CachingArena::Cache {
  std::map<size_t, std::vector<void*>> free_blocks;  // size class -> cached blocks
  std::unordered_map<void*, size_t> live_blocks;     // block -> its size class
  size_t reserved_bytes = 0;
  size_t peak_reserved_bytes = 0;
  size_t cached_bytes = 0;
  int64_t driver_allocations = 0;
  int64_t cache_hits = 0;
  int64_t trims = 0;
};

CachingArena::CachingArena(std::string name, Device device, size_t limit_bytes)
    : Arena(std::move(name), device, limit_bytes), cache_(std::make_unique<Cache>()) {}

CachingArena::~CachingArena() = default;

void* CachingArena::raw_allocate(size_t bytes, const std::string& what) {
  // Arena::allocate has already checked the requested bytes against the cap; this checks the
  // whole blocks, which are larger by the rounding and by what the cache holds.
  Cache& c = *cache_;
  const size_t block = size_class(bytes);
  auto it = c.free_blocks.find(block);
  if (it != c.free_blocks.end() && !it->second.empty()) {
    void* ptr = it->second.back();
    it->second.pop_back();
    c.cached_bytes -= block;
    c.live_blocks.emplace(ptr, block);
    ++c.cache_hits;
    return ptr;
  }
  const size_t limit = stats().limit_bytes;
  if (limit && c.reserved_bytes + block > limit) trim();
  if (limit && c.reserved_bytes + block > limit)
    fail("out of memory in ", name(), ": ", what, " (", format_bytes(bytes), ") needs a block of ",
         format_bytes(block), ", which does not fit: ", usage_report());
  void* ptr = driver_allocate(block);
  if (!ptr && c.cached_bytes > 0) {
    trim();  // the driver is out of memory; give back what the cache holds and try again
    ptr = driver_allocate(block);
  }
  if (!ptr)
    fail("out of memory in ", name(), ": the driver refused a block of ", format_bytes(block),
         " for ", what, " (", format_bytes(bytes), "): ", usage_report());
  c.live_blocks.emplace(ptr, block);
  c.reserved_bytes += block;
  c.peak_reserved_bytes = std::max(c.peak_reserved_bytes, c.reserved_bytes);
  ++c.driver_allocations;
  return ptr;
}

void CachingArena::raw_release(void* ptr) {
  Cache& c = *cache_;
  auto it = c.live_blocks.find(ptr);
  FRUGAL_CHECK(it != c.live_blocks.end(), "release of a block ", ptr, " that ", name(),
               " did not hand out");
  const size_t block = it->second;
  c.live_blocks.erase(it);
  c.free_blocks[block].push_back(ptr);
  c.cached_bytes += block;
}

void CachingArena::trim() {
  Cache& c = *cache_;
  for (auto& [block, list] : c.free_blocks) {
    for (void* ptr : list) driver_release(ptr);
    c.reserved_bytes -= block * list.size();
  }
  c.free_blocks.clear();
  c.cached_bytes = 0;
  ++c.trims;
}

void CachingArena::release_all_blocks() {
  if (!cache_) return;
  trim();
  // Blocks still live belong to tensors that outlive their arena (a bug elsewhere); free
  // them anyway rather than leak device memory.
  for (auto& [ptr, block] : cache_->live_blocks) driver_release(ptr);
  cache_->live_blocks.clear();
  cache_->reserved_bytes = 0;
}

CachingStats CachingArena::caching_stats() const {
  const MemoryStats base = stats();
  CachingStats s;
  s.in_use_bytes = base.in_use_bytes;
  s.peak_in_use_bytes = base.peak_bytes;
  s.limit_bytes = base.limit_bytes;
  s.reserved_bytes = cache_->reserved_bytes;
  s.peak_reserved_bytes = cache_->peak_reserved_bytes;
  s.cached_bytes = cache_->cached_bytes;
  s.driver_allocations = cache_->driver_allocations;
  s.cache_hits = cache_->cache_hits;
  s.trims = cache_->trims;
  return s;
}

std::string CachingArena::usage_report() const {
  const CachingStats s = caching_stats();
  std::ostringstream out;
  out << format_bytes(s.in_use_bytes) << " in use (peak " << format_bytes(s.peak_in_use_bytes)
      << "), " << format_bytes(s.reserved_bytes) << " reserved (" << format_bytes(s.cached_bytes)
      << " cached, peak " << format_bytes(s.peak_reserved_bytes) << "), cap "
      << (s.limit_bytes ? format_bytes(s.limit_bytes) : std::string("none"));
  return out.str();
}

void CachingArena::reset_peaks() {
  reset_peak();
  cache_->peak_reserved_bytes = cache_->reserved_bytes;
}

// ---- DeviceArena, PinnedHostArena ----------------------------------------------------------

DeviceArena::DeviceArena(int device, size_t limit_bytes, std::string name)
    : CachingArena(std::move(name), Device::cuda, limit_bytes), device_(device) {
  const int count = device_count();
  if (device < 0 || device >= count)
    fail("device memory on GPU ", device, ": this process sees ", count, " GPU(s)");
}

DeviceArena::~DeviceArena() {
  try {
    DeviceGuard guard(device_);
    release_all_blocks();
  } catch (const Error& e) {
    // At process exit the driver may already be gone; nothing is left to free then.
    std::fprintf(stderr, "frugal: releasing %s: %s\n", name().c_str(), e.what());
  }
}

void* DeviceArena::driver_allocate(size_t bytes) {
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it: an out-of-memory is reported by the caller
    return nullptr;
  }
  check_cuda(status, "cudaMalloc");
  return ptr;
}

void DeviceArena::driver_release(void* ptr) {
  DeviceGuard guard(device_);
  check_cuda(cudaFree(ptr), "cudaFree");
}

PinnedHostArena::PinnedHostArena(size_t limit_bytes, std::string name)
    : CachingArena(std::move(name), Device::cpu, limit_bytes) {}

PinnedHostArena::~PinnedHostArena() {
  try {
    release_all_blocks();
  } catch (const Error& e) {
    std::fprintf(stderr, "frugal: releasing %s: %s\n", name().c_str(), e.what());
  }
}

void* PinnedHostArena::driver_allocate(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t status = cudaMallocHost(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  check_cuda(status, "cudaMallocHost");
  return ptr;
}

void PinnedHostArena::driver_release(void* ptr) { check_cuda(cudaFreeHost(ptr), "cudaFreeHost"); }

// ---- Event, Stream -------------------------------------------------------------------------

Event::Event(bool timing) {
  check_cuda(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
             "cudaEventCreate");
}

Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}

Event::Event(Event&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_) cudaEventDestroy(event_);
    event_ = other.event_;
    other.event_ = nullptr;
  }
  return *this;
}

void Event::record(const Stream& stream) {
  check_cuda(cudaEventRecord(event_, stream.handle()), "cudaEventRecord");
}

bool Event::done() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  check_cuda(status, "cudaEventQuery");
  return true;
}

void Event::synchronize() const {
  check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, start.event_, event_), "cudaEventElapsedTime");
  return ms;
}

Stream::Stream(int device) : device_(device) {
  DeviceGuard guard(device);
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);
}

Stream::Stream(Stream&& other) noexcept : stream_(other.stream_), device_(other.device_) {
  other.stream_ = nullptr;
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = other.stream_;
    device_ = other.device_;
    other.stream_ = nullptr;
  }
  return *this;
}

void Stream::wait(const Event& event) const {
  check_cuda(cudaStreamWaitEvent(stream_, event.handle(), 0), "cudaStreamWaitEvent");
}

void Stream::wait(const Stream& other) const {
  Event event;
  event.record(other);
  wait(event);  // the wait holds on to the recorded work; the event may go now
}

void Stream::synchronize() const {
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void Stream::call_when_reached(std::function<void()> fn) const {
  auto* heap = new std::function<void()>(std::move(fn));
  const cudaHostFn_t trampoline = [](void* data) {
    std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(data));
    try {
      (*f)();
    } catch (...) {  // nothing may unwind into CUDA
    }
  };
  const cudaError_t status = cudaLaunchHostFunc(stream_, trampoline, heap);
  if (status != cudaSuccess) delete heap;
  check_cuda(status, "cudaLaunchHostFunc");
}

// ---- DeviceContext -------------------------------------------------------------------------

int device_for_local_rank(int local_rank) {
  const int count = device_count();
  if (count == 0) fail("the CUDA backend needs a GPU, and this process sees none");
  FRUGAL_CHECK(local_rank >= 0, "local rank ", local_rank);
  return local_rank % count;
}

namespace {
int select_device(int local_rank) {
  const int device = device_for_local_rank(local_rank);
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  return device;
}
}  // namespace

DeviceContext::DeviceContext(int local_rank, size_t device_limit_bytes, size_t pinned_limit_bytes)
    : device_(select_device(local_rank)),
      compute_(device_),
      comm_(device_),
      device_memory_(device_, device_limit_bytes),
      pinned_memory_(pinned_limit_bytes) {}

DeviceContext::~DeviceContext() {
  // Queued work may still read the arenas' blocks; let it finish before they are freed.
  cudaStreamSynchronize(compute_.handle());
  cudaStreamSynchronize(comm_.handle());
}

int DeviceContext::compute_capability() const {
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_),
             "cudaDeviceGetAttribute");
  return major * 10 + minor;
}

void DeviceContext::make_current() const { check_cuda(cudaSetDevice(device_), "cudaSetDevice"); }

void DeviceContext::synchronize() const {
  compute_.synchronize();
  comm_.synchronize();
}

// ---- copies --------------------------------------------------------------------------------

void copy_async(Tensor& dst, const Tensor& src, const Stream& stream) {
  FRUGAL_CHECK(dst.defined() && src.defined(), "copy of an undefined tensor");
  FRUGAL_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), "copy ",
               shape_string(src.shape()), " ", dtype_name(src.dtype()), " into ",
               shape_string(dst.shape()), " ", dtype_name(dst.dtype()));
  if (src.bytes() == 0) return;
  // cudaMemcpyDefault: unified addressing tells host from device memory, pinned or not.
  check_cuda(cudaMemcpyAsync(dst.raw(), src.raw(), src.bytes(), cudaMemcpyDefault, stream.handle()),
             "cudaMemcpyAsync");
}

Tensor clone_async(const Tensor& src, Arena& arena, const Stream& stream) {
  Tensor out = Tensor::empty(src.shape(), src.dtype(), arena);
  copy_async(out, src, stream);
  return out;
}

void fill_zero_async(Tensor& tensor, const Stream& stream) {
  FRUGAL_CHECK(tensor.defined(), "fill_zero of an undefined tensor");
  if (tensor.bytes() == 0) return;
  check_cuda(cudaMemsetAsync(tensor.raw(), 0, tensor.bytes(), stream.handle()), "cudaMemsetAsync");
}

Tensor to_host(const Tensor& src, const Stream& stream) {
  Tensor out = clone_async(src, host_arena(), stream);
  stream.synchronize();
  return out;
}

std::string gpu_pci_bus_id(int device) {
  char id[32] = {0};
  check_cuda(cudaDeviceGetPCIBusId(id, sizeof id, device), "cudaDeviceGetPCIBusId");
  return id;
}

double measure_host_to_device_gb_per_s(DeviceContext& context, size_t bytes) {
  const int64_t n = static_cast<int64_t>(bytes);
  Tensor host = Tensor::empty({n}, DType::u8, context.pinned_memory());
  Tensor device = Tensor::empty({n}, DType::u8, context.device_memory());
  const Stream& stream = context.comm();
  copy_async(device, host, stream);  // the first copy pays for mapping the pages
  Event start(true), end(true);
  constexpr int kCopies = 3;
  start.record(stream);
  for (int i = 0; i < kCopies; ++i) copy_async(device, host, stream);
  end.record(stream);
  end.synchronize();
  const double seconds = end.elapsed_ms_since(start) / 1e3;
  return seconds > 0 ? kCopies * double(bytes) / seconds / 1e9 : 0;
}

}  // namespace frugal

#else  // !FRUGAL_HAVE_CUDA

namespace frugal {
int device_count() { return 0; }
}  // namespace frugal

#endif  // FRUGAL_HAVE_CUDA
