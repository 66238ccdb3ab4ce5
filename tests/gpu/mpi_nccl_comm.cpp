// The NCCL communicator against host references: every collective, send/recv around the ring,
// broadcast, barrier, host scalars, groups and split, on per-rank data every rank can compute,
// in every dtype it moves (f32, bf16, f16, i32, i64, u8), with sizes that are not powers of two.
// Run under mpiexec -n 1 and -n 2; it skips itself when there are fewer GPUs than ranks.
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.h"
#include "core/device.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/nccl_comm.h"

using namespace frugal;

namespace {

// What every test needs: the MPI world, this rank's GPU, and an NCCL world over it. Made per
// test and destroyed at its end (NCCL first), so nothing outlives MPI_Finalize.
struct Fixture {
  std::unique_ptr<Comm> mpi;
  std::unique_ptr<DeviceContext> context;
  std::unique_ptr<Comm> nccl;
  ~Fixture() {
    nccl.reset();
    context.reset();
  }
};

// nullptr, after saying why, when this machine cannot run the test.
std::unique_ptr<Fixture> make_fixture() {
  auto mpi = make_mpi_world_comm(60);
  const int gpus = device_count();
  if (gpus == 0) {
    if (mpi->rank() == 0) std::printf("no GPU: skipping\n");
    return nullptr;
  }
  if (gpus < mpi->size()) {
    if (mpi->rank() == 0) std::printf("needs %d GPUs: skipping\n", mpi->size());
    return nullptr;
  }
  auto f = std::make_unique<Fixture>();
  f->mpi = std::move(mpi);
  f->context = std::make_unique<DeviceContext>(local_rank_from_environment());
  f->nccl = make_nccl_comm(*f->mpi, *f->context, 60);
  return f;
}

const DType kDTypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8};

// Small integers: exact in every dtype above, and so are their sums over a few ranks.
double value_of(int rank, int64_t i) { return double((rank + 1) * 3 + i % 11); }

void set_element(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32:
      t.data<float>()[i] = float(v);
      break;
    case DType::bf16:
      t.data<uint16_t>()[i] = float_to_bf16(float(v));
      break;
    case DType::f16:
      t.data<uint16_t>()[i] = float_to_f16(float(v));
      break;
    case DType::i32:
      t.data<int32_t>()[i] = int32_t(v);
      break;
    case DType::i64:
      t.data<int64_t>()[i] = int64_t(v);
      break;
    case DType::u8:
      t.data<uint8_t>()[i] = uint8_t(v);
      break;
    default:
      FAIL("dtype not in the test");
  }
}

double get_element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32:
      return t.data<float>()[i];
    case DType::bf16:
      return bf16_to_float(t.data<uint16_t>()[i]);
    case DType::f16:
      return f16_to_float(t.data<uint16_t>()[i]);
    case DType::i32:
      return t.data<int32_t>()[i];
    case DType::i64:
      return double(t.data<int64_t>()[i]);
    case DType::u8:
      return t.data<uint8_t>()[i];
    default:
      return 0;
  }
}

// A device tensor with element i = value(i).
Tensor device_tensor(Fixture& f, int64_t n, DType dtype,
                     const std::function<double(int64_t)>& value) {
  Tensor host = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) set_element(host, i, value(i));
  return clone_async(host, f.context->device_memory(), f.context->compute());
}

// Reads a device tensor back once the compute stream has caught up.
Tensor host_copy(Fixture& f, const Tensor& device) { return to_host(device, f.context->compute()); }

void check_equal(const Tensor& got, const std::function<double(int64_t)>& expected) {
  int64_t wrong = 0, first = -1;
  for (int64_t i = 0; i < got.numel(); ++i)
    if (get_element(got, i) != expected(i)) {
      if (first < 0) first = i;
      ++wrong;
    }
  INFO(dtype_name(got.dtype()) << ": " << wrong << " of " << got.numel()
                               << " elements wrong, first at " << first << ": got "
                               << (first >= 0 ? get_element(got, first) : 0) << ", expected "
                               << (first >= 0 ? expected(first) : 0));
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("nccl all_gather concatenates every rank's tensor in rank order", "[gpu][mpi]") {
  std::unique_ptr<Fixture> f = make_fixture();
  if (!f) return;
  Comm& comm = *f->nccl;
  const int rank = comm.rank(), ranks = comm.size();
  CHECK(comm.name() == "nccl:world");
  const int64_t n = 37;
  for (DType dtype : kDTypes) {
    Tensor send = device_tensor(*f, n, dtype, [&](int64_t i) { return value_of(rank, i); });
    Tensor recv = Tensor::empty({ranks * n}, dtype, f->context->device_memory());
    comm.all_gather(send, recv)->wait();
    check_equal(host_copy(*f, recv), [&](int64_t i) { return value_of(int(i / n), i % n); });
  }
}

TEST_CASE("nccl reduce_scatter_sum and all_reduce_sum add every rank's tensor", "[gpu][mpi]") {
  std::unique_ptr<Fixture> f = make_fixture();
  if (!f) return;
  Comm& comm = *f->nccl;
  const int rank = comm.rank(), ranks = comm.size();
  auto sum_over_ranks = [&](int64_t i) {
    double s = 0;
    for (int r = 0; r < ranks; ++r) s += value_of(r, i);
    return s;
  };
  const int64_t n = 53;
  for (DType dtype : kDTypes) {
    if (dtype == DType::u8 && ranks * (3 * ranks + 11) > 255) continue;  // would wrap
    Tensor send = device_tensor(*f, ranks * n, dtype, [&](int64_t i) { return value_of(rank, i); });
    Tensor recv = Tensor::empty({n}, dtype, f->context->device_memory());
    comm.reduce_scatter_sum(send, recv)->wait();
    check_equal(host_copy(*f, recv), [&](int64_t i) { return sum_over_ranks(rank * n + i); });

    Tensor buffer = device_tensor(*f, 1001, dtype, [&](int64_t i) { return value_of(rank, i); });
    Pending pending = comm.all_reduce_sum(buffer);
    pending->wait_host();  // the host-side wait, bounded by the timeout
    check_equal(host_copy(*f, buffer), sum_over_ranks);
  }
}

TEST_CASE("nccl send and recv pass tensors around the ring inside a group", "[gpu][mpi]") {
  std::unique_ptr<Fixture> f = make_fixture();
  if (!f) return;
  Comm& comm = *f->nccl;
  const int rank = comm.rank(), ranks = comm.size();
  const int next = (rank + 1) % ranks, previous = (rank + ranks - 1) % ranks;
  for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    Tensor out = device_tensor(*f, 29, dtype, [&](int64_t i) { return value_of(rank, i); });
    Tensor in = Tensor::empty({29}, dtype, f->context->device_memory());
    Pending sent, received;
    {
      CommGroup group(comm);
      sent = comm.send(out, next, 7);
      received = comm.recv(in, previous, 7);
      group.end();
    }
    sent->wait();
    received->wait();
    check_equal(host_copy(*f, in), [&](int64_t i) { return value_of(previous, i); });
  }
}

TEST_CASE("nccl groups run several collectives as one", "[gpu][mpi]") {
  std::unique_ptr<Fixture> f = make_fixture();
  if (!f) return;
  Comm& comm = *f->nccl;
  const int rank = comm.rank(), ranks = comm.size();
  std::vector<Tensor> sends, recvs;
  std::vector<Pending> pendings;
  comm.begin_group();
  for (int64_t n : {5, 17, 130}) {
    sends.push_back(device_tensor(*f, n, DType::f32, [&](int64_t i) { return value_of(rank, i); }));
    recvs.push_back(Tensor::empty({ranks * n}, DType::f32, f->context->device_memory()));
    pendings.push_back(comm.all_gather(sends.back(), recvs.back()));
  }
  CHECK_THROWS_AS(pendings[0]->wait(), Error);  // not before the group ends
  comm.end_group();
  for (Pending& p : pendings) p->wait();
  for (const Tensor& recv : recvs) {
    const int64_t n = recv.numel() / ranks;
    check_equal(host_copy(*f, recv), [&](int64_t i) { return value_of(int(i / n), i % n); });
  }
  // A handle dropped inside a group is joined when the group ends.
  Tensor buffer = device_tensor(*f, 9, DType::i32, [&](int64_t i) { return double(i); });
  {
    CommGroup group(comm);
    comm.all_reduce_sum(buffer);
  }
  check_equal(host_copy(*f, buffer), [&](int64_t i) { return double(i * ranks); });
}

TEST_CASE("nccl broadcast, barrier and host scalars", "[gpu][mpi]") {
  std::unique_ptr<Fixture> f = make_fixture();
  if (!f) return;
  Comm& comm = *f->nccl;
  const int rank = comm.rank(), ranks = comm.size();
  const int root = ranks - 1;
  for (DType dtype : kDTypes) {
    Tensor buffer = device_tensor(*f, 41, dtype, [&](int64_t i) { return value_of(rank, i); });
    comm.broadcast(buffer, root);
    check_equal(host_copy(*f, buffer), [&](int64_t i) { return value_of(root, i); });
  }
  comm.barrier();
  CHECK(comm.all_reduce_sum(double(rank) + 0.5) == Approx(ranks * (ranks - 1) / 2.0 + 0.5 * ranks));
  CHECK(comm.all_reduce_max(int64_t(rank * 10)) == int64_t((ranks - 1) * 10));
  CHECK(comm.broadcast_string(rank == 0 ? "from rank 0" : "", 0) == "from rank 0");
}

TEST_CASE("nccl split forms groups ordered by key", "[gpu][mpi]") {
  std::unique_ptr<Fixture> f = make_fixture();
  if (!f) return;
  Comm& comm = *f->nccl;
  const int rank = comm.rank(), ranks = comm.size();
  // Everyone in one group, in reverse order.
  std::unique_ptr<Comm> reversed = comm.split(0, ranks - 1 - rank);
  CHECK(reversed->size() == ranks);
  CHECK(reversed->rank() == ranks - 1 - rank);
  CHECK(reversed->name() == "nccl:world/0");
  const int64_t n = 11;
  Tensor send = device_tensor(*f, n, DType::f32, [&](int64_t i) { return value_of(rank, i); });
  Tensor recv = Tensor::empty({ranks * n}, DType::f32, f->context->device_memory());
  reversed->all_gather(send, recv)->wait();
  check_equal(host_copy(*f, recv),
              [&](int64_t i) { return value_of(ranks - 1 - int(i / n), i % n); });
  CHECK(reversed->all_reduce_max(int64_t(rank)) == ranks - 1);

  // Odd and even ranks apart.
  std::unique_ptr<Comm> parity = comm.split(rank % 2, rank);
  const int members = (ranks + 1 - rank % 2) / 2;
  CHECK(parity->size() == members);
  CHECK(parity->rank() == rank / 2);
  Tensor buffer = device_tensor(*f, 19, DType::bf16, [&](int64_t i) { return value_of(rank, i); });
  parity->all_reduce_sum(buffer)->wait();
  check_equal(host_copy(*f, buffer), [&](int64_t i) {
    double s = 0;
    for (int r = rank % 2; r < ranks; r += 2) s += value_of(r, i);
    return s;
  });
  parity->barrier();
}

TEST_CASE("nccl mesh matches the MPI mesh", "[gpu][mpi]") {
  std::unique_ptr<Fixture> f = make_fixture();
  if (!f) return;
  Mesh host_mesh = make_mesh(f->mpi->size(), 60);  // all ranks on the ring: dp = 1
  Mesh mesh = make_nccl_mesh(host_mesh, *f->context, 60);
  CHECK(mesh.world->size() == host_mesh.world->size());
  CHECK(mesh.cp->size() == host_mesh.cp->size());
  CHECK(mesh.cp->rank() == host_mesh.cp->rank());
  CHECK(mesh.dp->size() == 1);
  mesh.cp->barrier();
}
