// The mesh a plan assumes, and link bandwidths from the command line.
#include "plan/plan_cluster.h"

#include <cctype>

#include "core/error.h"

namespace frugal {

MeshShape mesh_shape(const Cluster& cluster, MeshKind kind, int64_t cp) {
  MeshShape mesh;
  mesh.cp = cp;
  if (kind == MeshKind::hybrid && cluster.nodes > 1) {
    mesh.shard = cluster.gpus_per_node;  // a node's ranks (dp_shard x cp)
    mesh.replicas = cluster.nodes;
  } else {
    mesh.shard = cluster.ranks();
    mesh.shard_spans_nodes = cluster.nodes > 1;
  }
  return mesh;
}

double parse_bandwidth(const std::string& text, const std::string& option) {
  auto bad = [&]() -> double {
    fail("option '", option, "': '", text,
         "' is not a bandwidth (a number with a unit: GB/s, MB/s, GiB/s, MiB/s, Gb/s, Mb/s)");
  };
  size_t used = 0;
  double number = 0;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    return bad();
  }
  std::string unit;
  for (size_t i = used; i < text.size(); ++i)
    if (text[i] != ' ') unit += text[i];
  static const std::pair<const char*, double> units[] = {{"GB/s", 1e9},
                                                         {"MB/s", 1e6},
                                                         {"GiB/s", 1073741824.0},
                                                         {"MiB/s", 1048576.0},
                                                         {"Gb/s", 1e9 / 8},
                                                         {"Mb/s", 1e6 / 8},
                                                         {"B/s", 1}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      if (!(number > 0) || number * scale > 1e15) return bad();
      return number * scale;
    }
  return bad();
}

}  // namespace frugal
