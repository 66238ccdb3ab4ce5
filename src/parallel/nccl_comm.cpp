// Comm over NCCL: collectives and point-to-point on device tensors, queued on the
// communication stream, with events to the compute stream and bounded host waits.
#include "parallel/nccl_comm.h"

#ifdef FRUGAL_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/device.h"

namespace frugal {

namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    fail("CUDA error in ", what, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
         ")");
}

ncclDataType_t nccl_type(DType t, bool summed) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
    case DType::e4m3:
    case DType::e5m2:
      // Moving fp8 bytes is exact; summing them in fp8 would lose most of the sum.
      if (!summed) return ncclUint8;
      break;
  }
  fail("NCCL cannot sum tensors of dtype ", dtype_name(t));
}

void check_device(const Tensor& t, const char* what) {
  FRUGAL_CHECK(t.defined() && t.device() == Device::cuda, what,
               ": the NCCL communicator takes device tensors");
}

// The NCCL communicator handle, shared by a Comm and the operations it has in flight, so that
// an operation outliving its Comm still has a live handle, and an abort is seen by all.
struct NcclHandle {
  ncclComm_t comm = nullptr;
  bool aborted = false;
  int rank = 0;
  std::string name;
  double timeout_s = 0;

  NcclHandle() = default;
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;
  ~NcclHandle() {
    if (comm && !aborted) ncclCommDestroy(comm);  // flushes what is still queued
  }
  void abort() {
    if (comm && !aborted) ncclCommAbort(comm);
    aborted = true;
  }
  void check(ncclResult_t result, const std::string& what) const {
    if (result == ncclSuccess) return;
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    fail("rank ", rank, ": NCCL error in ", what, " on ", name, ": ", ncclGetErrorString(result),
         last && *last ? std::string(" (") + last + ")" : std::string());
  }
};

// One operation, or the operations of one group: the event recorded on the communication
// stream after them, and the tensors they use, kept alive until the event is joined.
struct OpBatch {
  Event done;
  bool recorded = false;
  bool orphaned = false;  // a handle was dropped before its group ended
  std::vector<Tensor> tensors;
  std::string what;
};

class NcclPending : public PendingOp {
 public:
  NcclPending(std::shared_ptr<NcclHandle> handle, std::shared_ptr<OpBatch> batch,
              const Stream* compute, std::shared_ptr<CommFailure> failure)
      : handle_(std::move(handle)),
        batch_(std::move(batch)),
        compute_(compute),
        failure_(std::move(failure)) {}

  ~NcclPending() override {
    if (joined_) return;
    if (!batch_->recorded) {
      batch_->orphaned = true;  // end_group() joins the compute stream for us
      return;
    }
    if (failure_->failed()) {
      // The job is ending with an earlier error: abort the communicator, so that its kernels
      // stop and no stream waits for them, rather than joining an operation that never ends.
      handle_->abort();
      return;
    }
    try {
      wait();
    } catch (const Error& e) {
      // A destructor may not throw; the next use of the communicator reports the error.
      std::fprintf(stderr, "frugal: %s\n", e.what());
    }
  }

  void wait() override {
    if (joined_) return;
    FRUGAL_CHECK(batch_->recorded, "rank ", handle_->rank, ": ", batch_->what, " on ",
                 handle_->name, " waited before its group ended");
    if (failure_->failed()) {
      handle_->abort();
      fail("rank ", handle_->rank, ": ", batch_->what, " on ", handle_->name,
           " abandoned after an earlier failure: ", failure_->error());
    }
    if (handle_->aborted)
      fail("rank ", handle_->rank, ": ", batch_->what, " on ", handle_->name,
           ": the communicator was aborted after an earlier error");
    compute_->wait(batch_->done);
    joined_ = true;
  }

  void wait_host() override {
    wait();
    // Poll instead of cudaEventSynchronize, so that a peer that died or hung becomes an error
    // after timeout_s instead of a hang, and an NCCL failure is seen as soon as it happens.
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      const cudaError_t status = cudaEventQuery(batch_->done.handle());
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) check_cuda(status, "cudaEventQuery");
      ncclResult_t async = ncclSuccess;
      handle_->check(ncclCommGetAsyncError(handle_->comm, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        handle_->abort();
        fail_job(detail::concat("rank ", handle_->rank, ": ", batch_->what, " on ", handle_->name,
                                " failed: ", ncclGetErrorString(async),
                                "; the communicator is aborted"));
      }
      if (failure_->failed()) {  // another communicator's wait failed meanwhile
        handle_->abort();
        fail("rank ", handle_->rank, ": ", batch_->what, " on ", handle_->name,
             " abandoned after an earlier failure: ", failure_->error());
      }
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (handle_->timeout_s > 0 && waited > handle_->timeout_s) {
        handle_->abort();
        fail_job(detail::concat(
            "rank ", handle_->rank, ": ", batch_->what, " on ", handle_->name, " waited ",
            int(waited),
            " s for the other ranks (parallel.timeout_s); a rank has died, hung, or is running "
            "a different configuration. The communicator is aborted"));
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  // Records the job's failure (so that no other wait waits again) and throws it.
  [[noreturn]] void fail_job(const std::string& error) {
    failure_->record(error);
    fail(error);
  }

  std::shared_ptr<NcclHandle> handle_;
  std::shared_ptr<OpBatch> batch_;
  const Stream* compute_;
  std::shared_ptr<CommFailure> failure_;
  bool joined_ = false;
};

class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t comm, std::unique_ptr<Comm> host, DeviceContext& context, double timeout_s,
           std::string group)
      : Comm(host->failure()),
        handle_(std::make_shared<NcclHandle>()),
        host_(std::move(host)),
        context_(&context),
        timeout_s_(timeout_s),
        group_(std::move(group)) {
    handle_->comm = comm;
    handle_->name = name();
    handle_->timeout_s = timeout_s;
    handle_->check(ncclCommUserRank(comm, &rank_), "ncclCommUserRank");
    handle_->check(ncclCommCount(comm, &size_), "ncclCommCount");
    handle_->rank = rank_;
    FRUGAL_CHECK(rank_ == host_->rank() && size_ == host_->size(), "NCCL rank ", rank_, " of ",
                 size_, " but MPI rank ", host_->rank(), " of ", host_->size(), " on ", name());
    // The same ranks as the MPI group under it: the same nodes and counters.
    topology_ = host_->topology();
    // A one-element buffer for barrier(), allocated once.
    barrier_buffer_ = Tensor::empty({1}, DType::i32, context_->device_memory());
    fill_zero_async(barrier_buffer_, context_->compute());
  }

  ~NcclComm() override {
    if (group_depth_ > 0) ncclGroupEnd();  // an open group at teardown: close it, not hang
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl:" + group_; }

  Pending all_gather(const Tensor& send, Tensor& recv) override {
    check_device(send, "all_gather");
    check_device(recv, "all_gather");
    FRUGAL_CHECK(recv.numel() == send.numel() * size_ && recv.dtype() == send.dtype(),
                 "all_gather of ", send.numel(), " into ", recv.numel(), " elements on ", size_,
                 " ranks");
    const void* in = send.raw();
    void* out = recv.raw();
    const size_t count = size_t(send.numel());
    const ncclDataType_t type = nccl_type(send.dtype(), false);
    topology_.count(topology_.link(), all_gather_bytes(size_, send.bytes()));
    return enqueue("all-gather", {send, recv}, [&](cudaStream_t stream) {
      return ncclAllGather(in, out, count, type, handle_->comm, stream);
    });
  }

  Pending reduce_scatter_sum(const Tensor& send, Tensor& recv) override {
    check_device(send, "reduce_scatter");
    check_device(recv, "reduce_scatter");
    FRUGAL_CHECK(send.numel() == recv.numel() * size_ && recv.dtype() == send.dtype(),
                 "reduce_scatter of ", send.numel(), " into ", recv.numel(), " elements on ", size_,
                 " ranks");
    const void* in = send.raw();
    void* out = recv.raw();
    const size_t count = size_t(recv.numel());
    const ncclDataType_t type = nccl_type(send.dtype(), true);
    topology_.count(topology_.link(), reduce_scatter_bytes(size_, recv.bytes()));
    return enqueue("reduce-scatter", {send, recv}, [&](cudaStream_t stream) {
      return ncclReduceScatter(in, out, count, type, ncclSum, handle_->comm, stream);
    });
  }

  Pending all_reduce_sum(Tensor& buffer) override {
    check_device(buffer, "all_reduce");
    void* data = buffer.raw();
    const size_t count = size_t(buffer.numel());
    const ncclDataType_t type = nccl_type(buffer.dtype(), true);
    topology_.count(topology_.link(), all_reduce_bytes(size_, buffer.bytes()));
    return enqueue("all-reduce", {buffer}, [&](cudaStream_t stream) {
      return ncclAllReduce(data, data, count, type, ncclSum, handle_->comm, stream);
    });
  }

  Pending all_reduce_max(Tensor& buffer) override {
    check_device(buffer, "all_reduce");
    void* data = buffer.raw();
    const size_t count = size_t(buffer.numel());
    const ncclDataType_t type = nccl_type(buffer.dtype(), true);
    return enqueue("all-reduce (max)", {buffer}, [&](cudaStream_t stream) {
      return ncclAllReduce(data, data, count, type, ncclMax, handle_->comm, stream);
    });
  }

  Pending send(const Tensor& buffer, int peer, int tag) override {
    check_device(buffer, "send");
    FRUGAL_CHECK(peer >= 0 && peer < size_, "send to rank ", peer, " of ", size_);
    const void* data = buffer.raw();
    const size_t count = size_t(buffer.numel());
    const ncclDataType_t type = nccl_type(buffer.dtype(), false);
    return enqueue("send to rank " + std::to_string(peer), {buffer}, [&](cudaStream_t stream) {
      return ncclSend(data, count, type, peer, handle_->comm, stream);
    });
  }

  Pending recv(Tensor& buffer, int peer, int tag) override {
    check_device(buffer, "recv");
    FRUGAL_CHECK(peer >= 0 && peer < size_, "receive from rank ", peer, " of ", size_);
    void* data = buffer.raw();
    const size_t count = size_t(buffer.numel());
    const ncclDataType_t type = nccl_type(buffer.dtype(), false);
    if (!topology_.node_of_rank.empty())
      topology_.count(topology_.link_between(rank_, peer), buffer.bytes());
    return enqueue("receive from rank " + std::to_string(peer), {buffer}, [&](cudaStream_t stream) {
      return ncclRecv(data, count, type, peer, handle_->comm, stream);
    });
  }

  void broadcast(Tensor& buffer, int root) override {
    check_device(buffer, "broadcast");
    FRUGAL_CHECK(group_depth_ == 0, "broadcast inside a group on ", name());
    FRUGAL_CHECK(root >= 0 && root < size_, "broadcast from rank ", root, " of ", size_);
    void* data = buffer.raw();
    const size_t count = size_t(buffer.numel());
    const ncclDataType_t type = nccl_type(buffer.dtype(), false);
    if (rank_ != root) topology_.count(topology_.link(), buffer.bytes());
    enqueue("broadcast", {buffer}, [&](cudaStream_t stream) {
      return ncclBroadcast(data, data, count, type, root, handle_->comm, stream);
    })->wait_host();
  }

  void barrier() override {
    FRUGAL_CHECK(group_depth_ == 0, "barrier inside a group on ", name());
    // An all-reduce of one int, waited on the host: every rank has reached this point and
    // every collective queued before it on this communicator has finished.
    all_reduce_sum(barrier_buffer_)->wait_host();
  }

  double all_reduce_sum(double value) override { return host_->all_reduce_sum(value); }
  int64_t all_reduce_max(int64_t value) override { return host_->all_reduce_max(value); }
  std::string broadcast_string(const std::string& value, int root) override {
    return host_->broadcast_string(value, root);
  }

  std::unique_ptr<Comm> split(int color, int key) const override {
    FRUGAL_CHECK(group_depth_ == 0, "split inside a group on ", name());
    FRUGAL_CHECK(color >= 0, "split with color ", color, " on ", name());
    std::unique_ptr<Comm> host = host_->split(color, key);
    context_->make_current();
    ncclComm_t sub = nullptr;
    handle_->check(ncclCommSplit(handle_->comm, color, key, &sub, nullptr), "ncclCommSplit");
    return std::make_unique<NcclComm>(sub, std::move(host), *context_, timeout_s_,
                                      group_ + "/" + std::to_string(color));
  }

  void begin_group() override {
    handle_->check(ncclGroupStart(), "ncclGroupStart");
    if (group_depth_++ == 0) {
      open_batch_ = std::make_shared<OpBatch>();
      open_batch_->what = "group of";
    }
  }

  void end_group() override {
    FRUGAL_CHECK(group_depth_ > 0, "end_group without begin_group on ", name());
    --group_depth_;
    // After an abort (an operation of the group refused to start, the job failing) the group
    // is only closed: its error is the one already being reported, and CommGroup's destructor,
    // which ends a group left open by that error, must not turn it into an abort().
    const ncclResult_t ended = ncclGroupEnd();
    if (!handle_->aborted) handle_->check(ended, "ncclGroupEnd");
    if (group_depth_ > 0) return;
    // NCCL launches a group's operations at its outermost end: record their event only now.
    std::shared_ptr<OpBatch> batch = std::move(open_batch_);
    batch->done.record(context_->comm());
    batch->recorded = true;
    if (batch->orphaned) context_->compute().wait(batch->done);
  }

 private:
  template <class Launch>
  Pending enqueue(const std::string& what, std::vector<Tensor> tensors, Launch&& launch) {
    if (failure_->failed()) {
      handle_->abort();
      fail("rank ", rank_, ": ", what, " on ", name(),
           " not started after an earlier failure: ", failure_->error());
    }
    if (handle_->aborted)
      fail("rank ", rank_, ": ", what, " on ", name(),
           ": the communicator was aborted after an earlier error");
    // The inputs were written by work queued on the compute stream: the communication stream
    // waits for it. (Inside a group this wait is queued before the group's launch.)
    compute_ready_.record(context_->compute());
    context_->comm().wait(compute_ready_);
    handle_->check(launch(context_->comm().handle()), what);
    std::shared_ptr<OpBatch> batch = open_batch_ ? open_batch_ : std::make_shared<OpBatch>();
    for (Tensor& t : tensors) batch->tensors.push_back(std::move(t));
    if (open_batch_) {
      batch->what += " " + what;
    } else {
      batch->what = what;
      batch->done.record(context_->comm());
      batch->recorded = true;
    }
    return std::make_unique<NcclPending>(handle_, batch, &context_->compute(), failure_);
  }

  std::shared_ptr<NcclHandle> handle_;
  std::unique_ptr<Comm> host_;
  DeviceContext* context_;
  double timeout_s_;
  std::string group_;
  int rank_ = 0;
  int size_ = 1;
  Event compute_ready_;
  Tensor barrier_buffer_;
  int group_depth_ = 0;
  std::shared_ptr<OpBatch> open_batch_;
};

// "mpi:world/1" -> "world/1"
std::string group_of(const std::string& comm_name) {
  const size_t colon = comm_name.find(':');
  return colon == std::string::npos ? comm_name : comm_name.substr(colon + 1);
}

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap_mpi, DeviceContext& context,
                                     double timeout_s) {
  context.make_current();
  const int rank = bootstrap_mpi.rank(), size = bootstrap_mpi.size();
  // An MPI communicator of our own over the same ranks, for the host scalars.
  std::unique_ptr<Comm> host = bootstrap_mpi.split(0, rank);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::string id_bytes;
  if (rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) fail("NCCL error in ncclGetUniqueId: ", ncclGetErrorString(result));
    id_bytes.assign(id.internal, sizeof(id.internal));
  }
  // broadcast_string is bounded by the MPI timeout: a missing rank is an error, not a hang.
  id_bytes = bootstrap_mpi.broadcast_string(id_bytes, 0);
  FRUGAL_CHECK(id_bytes.size() == sizeof(id.internal), "NCCL id of ", id_bytes.size(), " bytes");
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRank(&comm, size, id, rank);
  if (result != ncclSuccess)
    fail("rank ", rank, ": NCCL error in ncclCommInitRank over ", size, " ranks on GPU ",
         context.device(), ": ", ncclGetErrorString(result), " (", ncclGetLastError(nullptr), ")");
  return std::make_unique<NcclComm>(comm, std::move(host), context, timeout_s,
                                    group_of(bootstrap_mpi.name()));
}

Mesh make_nccl_mesh(Mesh& host_mesh, DeviceContext& context, double timeout_s) {
  Mesh mesh;
  mesh.world = make_nccl_comm(*host_mesh.world, context, timeout_s);
  mesh.dp_size = host_mesh.dp_size;
  mesh.cp_size = host_mesh.cp_size;
  mesh.dp_rank = host_mesh.dp_rank;
  mesh.cp_rank = host_mesh.cp_rank;
  mesh.local_rank = host_mesh.local_rank;
  // The same colors and keys as make_mesh, so the groups match the MPI mesh's.
  mesh.dp_shard = host_mesh.dp_shard;
  mesh.dp_replicate = host_mesh.dp_replicate;
  mesh.replica_rank = host_mesh.replica_rank;
  mesh.node_of_rank = host_mesh.node_of_rank;
  mesh.traffic = host_mesh.traffic;
  const int per_replica = mesh.dp_shard * mesh.cp_size;
  const int place = mesh.world->rank() % per_replica;
  mesh.cp = mesh.world->split(mesh.dp_rank, mesh.cp_rank);
  mesh.dp = mesh.world->split(mesh.cp_rank, mesh.dp_rank);
  mesh.shard = mesh.world->split(mesh.replica_rank, place);
  mesh.replica = mesh.world->split(place, mesh.replica_rank);
  return mesh;
}

}  // namespace frugal

#endif  // FRUGAL_HAVE_CUDA
