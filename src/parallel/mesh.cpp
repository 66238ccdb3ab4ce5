// Building the dp_replicate x dp_shard x cp mesh from the MPI world, and where its ranks live.
#include "parallel/mesh.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "core/error.h"

namespace frugal {

int local_rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return 0;
}

namespace {

// The data-parallel ranks of one node when the nodes are equal blocks of consecutive ranks that
// cp divides, so that a replica is a node; 0 otherwise.
int node_sized_dp_shard(const std::vector<int>& node_of_rank, int cp) {
  const int world = int(node_of_rank.size());
  const int per_node =
      int(std::count(node_of_rank.begin(), node_of_rank.end(), node_of_rank.front()));
  if (world % per_node != 0 || per_node % cp != 0) return 0;
  // (Nodes are numbered in the order of their first rank.)
  for (int r = 0; r < world; ++r)
    if (node_of_rank[size_t(r)] != r / per_node) return 0;
  return per_node / cp;
}

}  // namespace

int Mesh::nodes() const {
  return int(std::set<int>(node_of_rank.begin(), node_of_rank.end()).size());
}

std::string Mesh::describe() const {
  return std::to_string(world->size()) + " rank(s) = dp_replicate " + std::to_string(dp_replicate) +
         " x dp_shard " + std::to_string(dp_shard) + " x cp " + std::to_string(cp_size) + " on " +
         std::to_string(nodes()) + " node(s)";
}

Mesh make_mesh(const MeshShape& shape, double timeout_s) {
  Mesh mesh;
  mesh.world = make_mpi_world_comm(timeout_s);
  const int world = mesh.world->size(), rank = mesh.world->rank();
  const int64_t cp = shape.cp;
  if (cp < 1 || world % cp != 0)
    fail("config key 'parallel.cp': ", cp, " does not divide the ", world, " ranks");
  if (shape.node_ranks > 0) {
    if (world % shape.node_ranks != 0)
      fail("config key 'parallel.node_ranks': ", shape.node_ranks, " does not divide the ", world,
           " ranks");
    for (int r = 0; r < world; ++r) mesh.node_of_rank.push_back(int(r / shape.node_ranks));
  } else {
    mesh.node_of_rank = mpi_node_of_rank();
  }
  mesh.traffic = std::make_shared<LinkTraffic>();
  mesh.world->set_topology({mesh.node_of_rank, mesh.traffic});

  mesh.cp_size = int(cp);
  mesh.dp_size = world / mesh.cp_size;
  mesh.cp_rank = rank % mesh.cp_size;
  mesh.dp_rank = rank / mesh.cp_size;
  if (shape.dp_shard > 0) {
    if (mesh.dp_size % shape.dp_shard != 0)
      fail("config key 'parallel.dp_shard': ", shape.dp_shard, " does not divide the ",
           mesh.dp_size, " data-parallel ranks (", world, " ranks / parallel.cp ", cp, ")");
    mesh.dp_shard = int(shape.dp_shard);
  } else {
    const int per_node = node_sized_dp_shard(mesh.node_of_rank, mesh.cp_size);
    mesh.dp_shard = per_node > 0 ? per_node : mesh.dp_size;
  }
  mesh.dp_replicate = mesh.dp_size / mesh.dp_shard;
  const int per_replica = mesh.dp_shard * mesh.cp_size;
  mesh.replica_rank = rank / per_replica;
  const int place = rank % per_replica;
  mesh.cp = mesh.world->split(mesh.dp_rank, mesh.cp_rank);
  mesh.dp = mesh.world->split(mesh.cp_rank, mesh.dp_rank);
  mesh.shard = mesh.world->split(mesh.replica_rank, place);
  mesh.replica = mesh.world->split(place, mesh.replica_rank);
  mesh.local_rank = local_rank_from_environment();
  return mesh;
}

Mesh make_mesh(int cp, double timeout_s) {
  MeshShape shape;
  shape.cp = cp;
  shape.dp_shard = cp >= 1 ? std::max(1, mpi_world_size() / cp) : 1;
  return make_mesh(shape, timeout_s);
}

}  // namespace frugal
