// Comm over MPI: non-blocking MPI-3 collectives on host buffers, with timed waits.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/log.h"
#include "parallel/comm.h"

namespace frugal {

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
    case DType::e4m3:
    case DType::e5m2:
      return MPI_UINT8_T;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;
  }
  fail("no MPI type for dtype ", dtype_name(t));
}

// MPI counts are ints: larger buffers would need chunking, which frugal does not yet do.
int mpi_count(int64_t n, const char* what) {
  if (n > int64_t(INT32_MAX)) fail(what, ": ", n, " elements exceed one MPI call's limit");
  return static_cast<int>(n);
}

void check_host(const Tensor& t, const char* what) {
  FRUGAL_CHECK(t.device() == Device::cpu, what, ": the MPI communicator takes host tensors");
}

class MpiPending : public PendingOp {
 public:
  MpiPending(MPI_Request request, std::string what, double timeout_s, int rank,
             std::shared_ptr<CommFailure> failure)
      : request_(request),
        what_(std::move(what)),
        timeout_s_(timeout_s),
        rank_(rank),
        failure_(std::move(failure)) {}
  ~MpiPending() override {
    // After a failed wait (this one's or another's) the job is ending with that error: waiting
    // here could only time out again.
    if (request_ == MPI_REQUEST_NULL || failure_->failed()) return;
    try {
      wait();
    } catch (const Error& e) {
      // A destructor may not throw: report and end the job, as a hung peer would.
      std::fprintf(stderr, "frugal: %s\n", e.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    // Poll with a short sleep instead of MPI_Wait, so that a peer that died or hung becomes an
    // error after timeout_s instead of a hang.
    const auto start = std::chrono::steady_clock::now();
    int done = 0;
    for (int spins = 0;; ++spins) {
      if (failure_->failed()) {
        // Abandoned, not completed: an active request can be neither freed nor cancelled.
        request_ = MPI_REQUEST_NULL;
        fail("rank ", rank_, ": ", what_,
             " abandoned after an earlier failure: ", failure_->error());
      }
      MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (done) {
        failure_->add_wait_seconds(waited);
        return;
      }
      if (timeout_s_ > 0 && waited > timeout_s_) {
        const std::string error =
            detail::concat("rank ", rank_, ": ", what_, " waited ", int(waited),
                           " s for the other ranks (parallel.timeout_s); a rank has died, hung, "
                           "or is running a different configuration");
        failure_->record(error);
        request_ = MPI_REQUEST_NULL;
        fail(error);
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  MPI_Request request_;
  std::string what_;
  double timeout_s_;
  int rank_;
  std::shared_ptr<CommFailure> failure_;
};

class MpiComm : public Comm {
 public:
  MpiComm(MPI_Comm comm, double timeout_s, std::string group, std::shared_ptr<CommFailure> failure)
      : Comm(std::move(failure)), comm_(comm), timeout_s_(timeout_s), group_(std::move(group)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi:" + group_; }

  Pending all_gather(const Tensor& send, Tensor& recv) override {
    check_usable("all-gather");
    check_host(send, "all_gather");
    FRUGAL_CHECK(recv.numel() == send.numel() * size_ && recv.dtype() == send.dtype(),
                 "all_gather of ", send.numel(), " into ", recv.numel(), " elements on ", size_,
                 " ranks");
    topology_.count(topology_.link(), all_gather_bytes(size_, send.bytes()));
    MPI_Request r;
    const int n = mpi_count(send.numel(), "all_gather");
    MPI_Iallgather(send.raw(), n, mpi_type(send.dtype()), recv.raw(), n, mpi_type(recv.dtype()),
                   comm_, &r);
    return pending(r, "all-gather");
  }

  Pending reduce_scatter_sum(const Tensor& send, Tensor& recv) override {
    check_usable("reduce-scatter");
    check_host(send, "reduce_scatter");
    FRUGAL_CHECK(send.numel() == recv.numel() * size_ && recv.dtype() == send.dtype(),
                 "reduce_scatter of ", send.numel(), " into ", recv.numel(), " elements on ", size_,
                 " ranks");
    topology_.count(topology_.link(), reduce_scatter_bytes(size_, recv.bytes()));
    MPI_Request r;
    MPI_Ireduce_scatter_block(send.raw(), recv.raw(), mpi_count(recv.numel(), "reduce_scatter"),
                              mpi_type(send.dtype()), MPI_SUM, comm_, &r);
    return pending(r, "reduce-scatter");
  }

  Pending all_reduce_sum(Tensor& buffer) override {
    check_usable("all-reduce");
    check_host(buffer, "all_reduce");
    FRUGAL_CHECK(buffer.dtype() != DType::bf16 && buffer.dtype() != DType::f16,
                 "all_reduce_sum of ", dtype_name(buffer.dtype()),
                 " on the MPI communicator, which sums no 16-bit floats");
    topology_.count(topology_.link(), all_reduce_bytes(size_, buffer.bytes()));
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, buffer.raw(), mpi_count(buffer.numel(), "all_reduce"),
                   mpi_type(buffer.dtype()), MPI_SUM, comm_, &r);
    return pending(r, "all-reduce");
  }

  Pending all_reduce_max(Tensor& buffer) override {
    check_usable("all-reduce");
    check_host(buffer, "all_reduce");
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, buffer.raw(), mpi_count(buffer.numel(), "all_reduce"),
                   mpi_type(buffer.dtype()), MPI_MAX, comm_, &r);
    return pending(r, "all-reduce (max)");
  }

  Pending send(const Tensor& buffer, int peer, int tag) override {
    check_usable("send");
    check_host(buffer, "send");
    MPI_Request r;
    MPI_Isend(buffer.raw(), mpi_count(buffer.numel(), "send"), mpi_type(buffer.dtype()), peer, tag,
              comm_, &r);
    return pending(r, "send to rank " + std::to_string(peer));
  }

  Pending recv(Tensor& buffer, int peer, int tag) override {
    check_usable("receive");
    check_host(buffer, "recv");
    if (!topology_.node_of_rank.empty())
      topology_.count(topology_.link_between(rank_, peer), buffer.bytes());
    MPI_Request r;
    MPI_Irecv(buffer.raw(), mpi_count(buffer.numel(), "recv"), mpi_type(buffer.dtype()), peer, tag,
              comm_, &r);
    return pending(r, "receive from rank " + std::to_string(peer));
  }

  void broadcast(Tensor& buffer, int root) override {
    check_usable("broadcast");
    check_host(buffer, "broadcast");
    if (rank_ != root) topology_.count(topology_.link(), buffer.bytes());
    MPI_Request r;
    MPI_Ibcast(buffer.raw(), mpi_count(buffer.numel(), "broadcast"), mpi_type(buffer.dtype()), root,
               comm_, &r);
    pending(r, "broadcast")->wait();
  }

  void barrier() override {
    check_usable("barrier");
    MPI_Request r;
    MPI_Ibarrier(comm_, &r);
    pending(r, "barrier")->wait();
  }

  double all_reduce_sum(double value) override {
    check_usable("all-reduce");
    double out = 0;
    MPI_Request r;
    MPI_Iallreduce(&value, &out, 1, MPI_DOUBLE, MPI_SUM, comm_, &r);
    pending(r, "all-reduce")->wait();
    return out;
  }

  int64_t all_reduce_max(int64_t value) override {
    check_usable("all-reduce");
    int64_t out = 0;
    MPI_Request r;
    MPI_Iallreduce(&value, &out, 1, MPI_INT64_T, MPI_MAX, comm_, &r);
    pending(r, "all-reduce")->wait();
    return out;
  }

  std::string broadcast_string(const std::string& value, int root) override {
    check_usable("broadcast");
    int64_t length = rank_ == root ? int64_t(value.size()) : 0;
    MPI_Request r;
    MPI_Ibcast(&length, 1, MPI_INT64_T, root, comm_, &r);
    pending(r, "broadcast")->wait();
    std::string out = rank_ == root ? value : std::string(size_t(length), '\0');
    MPI_Ibcast(out.data(), mpi_count(length, "broadcast"), MPI_CHAR, root, comm_, &r);
    pending(r, "broadcast")->wait();
    return out;
  }

  std::unique_ptr<Comm> split(int color, int key) const override {
    // MPI_Comm_split blocks without a bound: a timed barrier first, so that a rank that never
    // comes is an error after timeout_s, not a hang.
    check_usable("split");
    MPI_Request r;
    MPI_Ibarrier(comm_, &r);
    pending(r, "barrier before a split")->wait();
    MPI_Comm sub;
    MPI_Comm_split(comm_, color, key, &sub);
    auto out =
        std::make_unique<MpiComm>(sub, timeout_s_, group_ + "/" + std::to_string(color), failure_);
    out->set_topology(sub_topology(sub));
    return out;
  }

 private:
  // The topology of a group split from this one: its ranks' nodes, found by translating its
  // ranks into this group's (a local call).
  CommTopology sub_topology(MPI_Comm sub) const {
    CommTopology out;
    out.traffic = topology_.traffic;
    if (topology_.node_of_rank.empty()) return out;
    MPI_Group mine, theirs;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(sub, &theirs);
    int n = 0;
    MPI_Group_size(theirs, &n);
    std::vector<int> ranks(static_cast<size_t>(n)), here(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ranks[size_t(i)] = i;
    MPI_Group_translate_ranks(theirs, n, ranks.data(), mine, here.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&theirs);
    for (int r : here) out.node_of_rank.push_back(topology_.node_of_rank.at(size_t(r)));
    return out;
  }
  // No operation starts after a failed wait: it could not complete, and the job is ending.
  void check_usable(const char* what) const {
    if (failure_->failed())
      fail("rank ", rank_, ": ", what, " on ", name(),
           " not started after an earlier failure: ", failure_->error());
  }
  Pending pending(MPI_Request r, const std::string& what) const {
    return std::make_unique<MpiPending>(r, what + " on " + name(), timeout_s_, rank_, failure_);
  }

  MPI_Comm comm_;
  double timeout_s_;
  std::string group_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_world_comm(double timeout_s) {
  return std::make_unique<MpiComm>(MPI_COMM_WORLD, timeout_s, "world",
                                   std::make_shared<CommFailure>());
}

int mpi_world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int mpi_world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

int mpi_node_size() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int size = 1;
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return size;
}

std::vector<int> mpi_node_of_rank() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int rank = 0, size = 1, first = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Allreduce(&rank, &first, 1, MPI_INT, MPI_MIN, node);  // the node's first world rank
  MPI_Comm_free(&node);
  std::vector<int> firsts(size_t(size), 0);
  MPI_Allgather(&first, 1, MPI_INT, firsts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> node_of_rank, seen;
  for (int f : firsts) {
    const auto it = std::find(seen.begin(), seen.end(), f);
    node_of_rank.push_back(int(it - seen.begin()));
    if (it == seen.end()) seen.push_back(f);
  }
  return node_of_rank;
}

}  // namespace frugal
