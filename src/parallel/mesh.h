// The process mesh: world = dp_replicate x dp_shard x cp, cp innermost
// (rank = (replica * dp_shard + shard_dp) * cp + cp_rank), so ring neighbours share a node when
// they can, and a replica (dp_shard x cp consecutive ranks) is one node by default. ZeRO-3
// shards the weights over the ranks of a replica; the replicas hold the same shards and sum
// their gradients once per step (hybrid sharding, HSDP). Ranks come from mpirun or srun; the
// local rank picks the GPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/link_traffic.h"

namespace frugal {

struct Mesh {
  std::unique_ptr<Comm> world;  // every rank
  std::unique_ptr<Comm> dp;     // ranks that see different sequences (same cp_rank)
  std::unique_ptr<Comm> cp;     // ranks that share sequences (same dp_rank): the ring
  // The ranks of this rank's replica (dp_shard x cp): ZeRO-3 shards parameters over them.
  std::unique_ptr<Comm> shard;
  // The ranks at the same place of every replica (dp_replicate of them): they hold the same
  // shards and all-reduce their gradient shards. One rank alone without replicas.
  std::unique_ptr<Comm> replica;
  int dp_size = 1, cp_size = 1, dp_rank = 0, cp_rank = 0;
  int dp_shard = 1, dp_replicate = 1, replica_rank = 0;
  int local_rank = 0;                    // this rank's index on its node
  std::vector<int> node_of_rank;         // by world rank: the node each rank is on (0, 1, ...)
  std::shared_ptr<LinkTraffic> traffic;  // every communicator of the mesh counts into it

  int nodes() const;
  // "8 ranks = dp_replicate 2 x dp_shard 2 x cp 2 on 2 nodes"
  std::string describe() const;
};

struct MeshShape {
  int64_t cp = 1;
  // Data-parallel ranks per replica; 0: the ranks of one node divided by cp (every rank in one
  // replica when the nodes differ in size, are not contiguous blocks of ranks, or cp does not
  // divide them).
  int64_t dp_shard = 0;
  // Ranks per node, in blocks of consecutive ranks; 0: the ranks that share memory
  // (MPI_Comm_split_type). Set, it places one machine's ranks as if on several nodes (tests).
  int64_t node_ranks = 0;
};

// Throws Error naming the config key when cp or dp_shard does not divide the ranks.
Mesh make_mesh(const MeshShape& shape, double timeout_s);
// dp x cp over every rank: one replica (flat ZeRO-3).
Mesh make_mesh(int cp, double timeout_s);

// OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, else 0.
int local_rank_from_environment();

}  // namespace frugal
