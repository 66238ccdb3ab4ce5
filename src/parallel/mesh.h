// The process mesh: world = dp x cp, cp innermost (rank = dp_rank * cp + cp_rank), so ring
// neighbours share a node when they can. Ranks come from mpirun or srun; the local rank picks
// the GPU.
#pragma once

#include <memory>

#include "parallel/comm.h"

namespace frugal {

struct Mesh {
  std::unique_ptr<Comm> world;  // every rank; ZeRO-3 shards parameters over it
  std::unique_ptr<Comm> dp;     // ranks that see different sequences (same cp_rank)
  std::unique_ptr<Comm> cp;     // ranks that share sequences (same dp_rank): the ring
  int dp_size = 1, cp_size = 1, dp_rank = 0, cp_rank = 0;
  int local_rank = 0;           // this rank's index on its node
};

// Throws Error when cp does not divide the number of ranks.
Mesh make_mesh(int cp, double timeout_s);

// OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, else 0.
int local_rank_from_environment();

}  // namespace frugal
