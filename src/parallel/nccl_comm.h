// Comm over NCCL, on device tensors: collectives queued on the communication stream of a
// DeviceContext, joined to the compute stream by events.
#pragma once

#include <memory>

#include "parallel/comm.h"
#include "parallel/mesh.h"

namespace frugal {

class DeviceContext;

#ifdef FRUGAL_HAVE_CUDA

// A communicator over the same ranks as `bootstrap_mpi` (rank r here is rank r there), made
// from an id that rank 0 broadcasts over it. Collective: every rank of bootstrap_mpi calls it.
// The context must outlive the communicator; one GPU per rank.
//
// Semantics, where they differ from the MPI communicator:
// - Tensors are device tensors: f32, bf16, f16, f64, i32, i64, u8; fp8 is moved but not
//   summed. Each operation first makes the communication stream wait for the work queued so far on
//   the compute stream (the inputs are written there), then runs on the communication stream.
// - Pending::wait() does not block the host: it makes the compute stream wait for the
//   operation. Pending::wait_host() blocks the host until the GPU finished it, polling NCCL's
//   async error; past timeout_s it aborts the communicator and throws an Error naming the
//   operation and the rank. broadcast() and barrier() wait on the host.
// - send/recv ignore the tag (NCCL keeps the order between two ranks); a send and a recv
//   that pair up across ranks must be issued inside one group (CommGroup), or they deadlock.
// - Host scalars (all_reduce_sum(double), all_reduce_max, broadcast_string) go over MPI.
// - split() makes both an NCCL sub-communicator (ncclCommSplit) and the MPI one under it.
std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap_mpi, DeviceContext& context, double timeout_s);

// The same mesh (ranks, groups, sizes) with NCCL communicators: world from host_mesh.world,
// then dp, cp, shard and replica split from it exactly as make_mesh splits the MPI world.
Mesh make_nccl_mesh(Mesh& host_mesh, DeviceContext& context, double timeout_s);

#endif  // FRUGAL_HAVE_CUDA

}  // namespace frugal
