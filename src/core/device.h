// The CUDA device runtime: a caching device allocator with a hard cap (to emulate a 24 GiB
// consumer card), pinned host memory for offload, streams and events, and async copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/tensor.h"

#ifdef FRUGAL_HAVE_CUDA
// Opaque CUDA handles: a CUstream_st* is a cudaStream_t, a CUevent_st* a cudaEvent_t, so
// kernel launchers can take stream.handle() directly, and this header needs no CUDA header.
struct CUstream_st;
struct CUevent_st;
#endif

namespace frugal {

#ifdef FRUGAL_HAVE_CUDA
inline constexpr bool kHaveCuda = true;
#else
inline constexpr bool kHaveCuda = false;
#endif

// Number of CUDA devices this process can use; 0 without a driver or a GPU, and in a build
// without CUDA. Never throws.
int device_count();

#ifdef FRUGAL_HAVE_CUDA

// What a caching arena holds. in_use counts the bytes that tensors asked for (as
// Arena::stats() does); reserved counts whole blocks taken from the driver: blocks in use
// (rounded up to their size class) plus blocks cached for reuse. The cap bounds both.
struct CachingStats {
  size_t in_use_bytes = 0;
  size_t peak_in_use_bytes = 0;
  size_t reserved_bytes = 0;
  size_t peak_reserved_bytes = 0;
  size_t cached_bytes = 0;
  size_t limit_bytes = 0;          // 0: no cap
  int64_t driver_allocations = 0;  // blocks taken from the driver (cudaMalloc, cudaMallocHost)
  int64_t cache_hits = 0;          // allocations served from a cached block
  int64_t trims = 0;               // times the cache was emptied (trim() or pressure)
};

// An Arena that keeps freed blocks in free lists, one per size class (512 B steps up to
// 1 MiB, 2 MiB steps above), and hands them out again before asking the driver. Reserved
// memory (in use + cached) never passes the cap: at the cap it first frees the cache, then
// refuses with an Error that names what was being allocated, its size, what is in use and
// reserved, and the cap; the arena stays usable after a refusal.
//
// A freed block is reused at once, from the host's point of view. That is safe when every
// user of the memory is ordered on one stream (the compute stream) or joined to it before
// the tensor is dropped: work on the communication stream is joined by Pending::wait().
class CachingArena : public Arena {
 public:
  ~CachingArena() override;

  CachingStats caching_stats() const;
  // "1.2 GiB in use (peak 3.4 GiB), 2 GiB reserved (0.8 GiB cached), cap 24 GiB"
  std::string usage_report() const;
  // Frees every cached block back to the driver.
  void trim();
  // Peaks restart from the current values.
  void reset_peaks();

 protected:
  CachingArena(std::string name, Device device, size_t limit_bytes);
  void* raw_allocate(size_t bytes, const std::string& what) override;
  void raw_release(void* ptr) override;
  // A block of exactly `bytes` from the driver, nullptr when it has none; and its release.
  virtual void* driver_allocate(size_t bytes) = 0;
  virtual void driver_release(void* ptr) = 0;
  // Subclasses call this in their destructor: the base destructor can no longer reach
  // driver_release.
  void release_all_blocks();

 private:
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

// Device memory of one GPU (Device::cuda), from cudaMalloc; never managed memory.
// limit_bytes (parallel.gpu_mem_limit) caps reserved bytes; 0: the card's own size.
class DeviceArena : public CachingArena {
 public:
  DeviceArena(int device, size_t limit_bytes, std::string name = "device memory");
  ~DeviceArena() override;
  int device_index() const { return device_; }

 protected:
  void* driver_allocate(size_t bytes) override;
  void driver_release(void* ptr) override;

 private:
  int device_;
};

// Page-locked host memory (Device::cpu) from cudaMallocHost: what offloaded optimizer state
// and parameters live in, so that copies to and from the device run asynchronously.
class PinnedHostArena : public CachingArena {
 public:
  explicit PinnedHostArena(size_t limit_bytes = 0, std::string name = "pinned host memory");
  ~PinnedHostArena() override;

 protected:
  void* driver_allocate(size_t bytes) override;
  void driver_release(void* ptr) override;
};

class Stream;

// A CUDA event (timing enabled only when asked: timing events are slower to record).
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);
  bool done() const;         // cudaEventQuery: the recorded work has finished
  void synchronize() const;  // the host waits for the recorded work
  // Milliseconds from `start` to this event (both recorded, both with timing).
  float elapsed_ms_since(const Event& start) const;
  CUevent_st* handle() const { return event_; }

 private:
  CUevent_st* event_ = nullptr;
};

// A non-blocking CUDA stream on one device (it does not synchronize with the legacy
// default stream).
class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Work queued on this stream after this call waits for the event's recorded work.
  void wait(const Event& event) const;
  // Work queued on this stream after this call waits for everything queued on `other` so far.
  void wait(const Stream& other) const;
  void synchronize() const;  // the host waits for everything queued so far
  // `fn` runs on CUDA's callback thread once everything queued so far has finished; later
  // work waits for it. It must not call CUDA, and what it throws is lost (catch it there).
  void call_when_reached(std::function<void()> fn) const;
  CUstream_st* handle() const { return stream_; }
  int device() const { return device_; }

 private:
  CUstream_st* stream_ = nullptr;
  int device_ = 0;
};

// One rank's GPU: the device, its memory (capped), pinned host memory, and two streams. The
// compute stream runs the kernels; the communication stream runs NCCL, so collectives
// overlap compute, joined by events. Make it once per process and pass it down; it must
// outlive every tensor of its arenas and every communicator made with it.
class DeviceContext {
 public:
  // Picks the GPU for this node-local rank (device_for_local_rank), makes it current for the
  // calling thread, and creates the streams. device_limit_bytes caps the device arena (0: no
  // cap beyond the card); pinned_limit_bytes caps the pinned host arena (0: none).
  explicit DeviceContext(int local_rank, size_t device_limit_bytes = 0,
                         size_t pinned_limit_bytes = 0);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device() const { return device_; }
  // major * 10 + minor: 89 for an RTX 4090 (sm_89), 90 for an H100 / H200.
  int compute_capability() const;
  const Stream& compute() const { return compute_; }
  const Stream& comm() const { return comm_; }
  DeviceArena& device_memory() { return device_memory_; }
  PinnedHostArena& pinned_memory() { return pinned_memory_; }
  // Makes this context's GPU current for the calling thread (e.g. a worker thread).
  void make_current() const;
  // Both streams drained.
  void synchronize() const;

 private:
  int device_;
  Stream compute_;
  Stream comm_;
  DeviceArena device_memory_;
  PinnedHostArena pinned_memory_;
};

// The GPU a node-local rank uses: local_rank modulo the visible devices (one rank per GPU
// when all are visible; device 0 when the launcher binds one GPU per rank). Throws Error
// when there is no GPU.
int device_for_local_rank(int local_rank);

// Copies src into dst (same shape and dtype, any of host, pinned host and device memory),
// queued on `stream`. Copies from or to pageable host memory return only once the host side
// is done; with pinned memory they return at once. Read dst only after the stream.
void copy_async(Tensor& dst, const Tensor& src, const Stream& stream);
// A new tensor in `arena` with src's contents (queued on `stream`).
Tensor clone_async(const Tensor& src, Arena& arena, const Stream& stream);
// Zeroes the tensor's bytes, queued on `stream` (any memory the device can reach).
void fill_zero_async(Tensor& tensor, const Stream& stream);
// A host copy of any tensor, complete on return (synchronizes `stream`): tests and logging.
Tensor to_host(const Tensor& src, const Stream& stream);

// The GPU's PCI bus id as NVML names it ("00000000:3B:00.0"): the health monitor finds its
// sensors by it, whatever CUDA_VISIBLE_DEVICES renumbered.
std::string gpu_pci_bus_id(int device);
// The rate of a pinned host -> device copy of `bytes` on this context's communication stream
// (the offload copies' stream), in GB/s: the link's peak the offload traffic is measured
// against. Synchronizes the stream.
double measure_host_to_device_gb_per_s(DeviceContext& context, size_t bytes);

#endif  // FRUGAL_HAVE_CUDA

}  // namespace frugal
