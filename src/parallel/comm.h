// The collectives frugal uses, behind one interface with two implementations: MPI on host
// buffers (the CPU backend, and what CI tests) and NCCL on device buffers. Non-blocking
// calls return a Pending handle; every wait is bounded by a timeout, so a rank that died
// or hung turns into a clear error on the others instead of a hang.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/link_traffic.h"

namespace frugal {

// The first failed wait among the communicators of a job: the MPI world, the groups split from
// it, and the NCCL communicators built over them share one. An operation that timed out can be
// neither completed nor cancelled, so the job ends with that error; until it does, every other
// wait on these communicators fails at once with it (a pending operation destroyed while the
// error unwinds, the next collective) instead of waiting timeout_s again. So a hung rank is
// reported after one parallel.timeout_s, not once per operation in flight.
class CommFailure {
 public:
  // Keeps the first error recorded.
  void record(const std::string& error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_.empty()) error_ = error;
  }
  bool failed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !error_.empty();
  }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }
  // The seconds this process spent blocked in completed waits on these communicators, so that
  // the health monitor can tell a rank's own work from its waiting for the others (a slow
  // rank waits least). Counted by the MPI waits; NCCL's run on the GPU and are not counted.
  void add_wait_seconds(double seconds) {
    waited_ns_.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
  }
  double waited_seconds() const {
    return 1e-9 * double(waited_ns_.load(std::memory_order_relaxed));
  }

 private:
  mutable std::mutex mutex_;
  std::string error_;
  std::atomic<int64_t> waited_ns_{0};
};

// A collective or point-to-point operation in flight. wait() completes it (and throws Error
// on timeout); destroying an unwaited handle waits, so buffers are never freed under an
// operation, unless a wait of the job has already failed (CommFailure): then the handle is
// dropped without waiting, since the job is ending.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual void wait() = 0;
  // Completes the operation as seen from the host, bounded by the timeout. For MPI this is
  // wait(); for NCCL, wait() only orders the compute stream after the operation, while this
  // blocks the host until the GPU finished it (and aborts the communicator on a timeout).
  virtual void wait_host() { wait(); }
};
using Pending = std::unique_ptr<PendingOp>;

class Comm {
 public:
  explicit Comm(std::shared_ptr<CommFailure> failure) : failure_(std::move(failure)) {}
  virtual ~Comm() = default;
  // The failure record shared with every communicator split from or built over this one.
  const std::shared_ptr<CommFailure>& failure() const { return failure_; }
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "mpi" or "nccl", plus the group, for messages

  // recv = the concatenation of every rank's send, in rank order (recv.numel = size * send.numel).
  virtual Pending all_gather(const Tensor& send, Tensor& recv) = 0;
  // recv = this rank's block of the element-wise sum of every rank's send
  // (send.numel = size * recv.numel).
  virtual Pending reduce_scatter_sum(const Tensor& send, Tensor& recv) = 0;
  virtual Pending all_reduce_sum(Tensor& buffer) = 0;
  // buffer = the element-wise maximum over the ranks (FP8 amaxes).
  virtual Pending all_reduce_max(Tensor& buffer) = 0;
  virtual Pending send(const Tensor& buffer, int peer, int tag) = 0;
  virtual Pending recv(Tensor& buffer, int peer, int tag) = 0;
  virtual void broadcast(Tensor& buffer, int root) = 0;
  virtual void barrier() = 0;

  // Host scalars, for norms, token counts and agreement checks.
  virtual double all_reduce_sum(double value) = 0;
  virtual int64_t all_reduce_max(int64_t value) = 0;
  virtual std::string broadcast_string(const std::string& value, int root) = 0;

  // Ranks with the same color form a new group, ordered by key. The group inherits the
  // topology (its ranks' nodes and the traffic counters).
  virtual std::unique_ptr<Comm> split(int color, int key) const = 0;

  // Which node each rank of this group is on, and the counters every tensor operation adds its
  // bytes to (link_traffic.h); set on the world by make_mesh, inherited by splits.
  void set_topology(CommTopology topology) { topology_ = std::move(topology); }
  const CommTopology& topology() const { return topology_; }

  // The operations issued between begin_group() and end_group() run as one (NCCL launches
  // them together; a send and a recv between the same ranks must be grouped there, or they
  // deadlock). Their Pending handles may be waited only after end_group(). Groups nest. MPI
  // operations are already non-blocking, so there these do nothing.
  virtual void begin_group() {}
  virtual void end_group() {}

 protected:
  std::shared_ptr<CommFailure> failure_;
  CommTopology topology_;
};

// A group of operations for the lifetime of a scope: CommGroup group(comm); ...; group.end();
// end() reports errors; the destructor ends a group left open (on an exception) and ends the
// process if that fails, since a destructor cannot throw.
class CommGroup {
 public:
  explicit CommGroup(Comm& comm) : comm_(&comm) { comm_->begin_group(); }
  ~CommGroup() {
    if (!comm_) return;
    try {
      end();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "frugal: ending a communication group: %s\n", e.what());
      std::abort();
    }
  }
  CommGroup(const CommGroup&) = delete;
  CommGroup& operator=(const CommGroup&) = delete;
  void end() {
    Comm* comm = comm_;
    comm_ = nullptr;
    if (comm) comm->end_group();
  }

 private:
  Comm* comm_;
};

// The MPI implementation over MPI_COMM_WORLD (or a split of it). timeout_s bounds every wait.
std::unique_ptr<Comm> make_mpi_world_comm(double timeout_s);

// The process-wide rank and size straight from MPI (for logging before a Comm exists).
int mpi_world_rank();
int mpi_world_size();
// The ranks on this node (those that share its memory): a collective of every rank.
int mpi_node_size();
// By world rank, the node each rank is on (those that share memory), numbered 0, 1, ... in the
// order of their first rank: a collective of every rank.
std::vector<int> mpi_node_of_rank();

}  // namespace frugal
