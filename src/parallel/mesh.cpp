// Building the dp x cp mesh from the MPI world.
#include "parallel/mesh.h"

#include <cstdlib>

#include "core/error.h"

namespace frugal {

int local_rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return 0;
}

Mesh make_mesh(int cp, double timeout_s) {
  Mesh mesh;
  mesh.world = make_mpi_world_comm(timeout_s);
  const int world = mesh.world->size(), rank = mesh.world->rank();
  if (cp < 1 || world % cp != 0)
    fail("config key 'parallel.cp': ", cp, " does not divide the ", world, " ranks");
  mesh.cp_size = cp;
  mesh.dp_size = world / cp;
  mesh.cp_rank = rank % cp;
  mesh.dp_rank = rank / cp;
  mesh.cp = mesh.world->split(mesh.dp_rank, mesh.cp_rank);
  mesh.dp = mesh.world->split(mesh.cp_rank, mesh.dp_rank);
  mesh.local_rank = local_rank_from_environment();
  return mesh;
}

}  // namespace frugal
