// The bytes a rank's collectives move, by the class of link they cross: within a node (NVLink,
// PCIe, shared memory) or across nodes (Ethernet, InfiniBand). The communicators count them as
// they post each operation; the step loop writes them per step to metrics.jsonl.
//
// The count is the bytes this rank receives, as ring algorithms move them: in a ring every link
// carries what each rank receives, so a group that spans nodes sends that much over its slowest
// link, and a group within one node sends nothing across nodes. A point-to-point receive counts
// by its peer's node. Host scalars (token counts, norms, agreements) are not counted.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace frugal {

enum class LinkClass { intra_node, inter_node };
// The names metrics.jsonl and the log use.
inline const char* link_class_name(LinkClass link) {
  return link == LinkClass::intra_node ? "intra_node" : "inter_node";
}

// Bytes one rank receives in a ring collective over `ranks` ranks.
inline uint64_t all_gather_bytes(int ranks, uint64_t send_bytes) {
  return uint64_t(ranks - 1) * send_bytes;
}
inline uint64_t reduce_scatter_bytes(int ranks, uint64_t recv_bytes) {
  return uint64_t(ranks - 1) * recv_bytes;
}
// A reduce-scatter then an all-gather, each of bytes / ranks: 2 (ranks - 1) / ranks of it.
inline uint64_t all_reduce_bytes(int ranks, uint64_t bytes) {
  return 2 * uint64_t(ranks - 1) * bytes / uint64_t(ranks);
}

// The counters of one process, shared by every communicator of its mesh (MPI and NCCL alike).
// Atomic: a host optimizer's thread may post collectives too.
class LinkTraffic {
 public:
  void add(LinkClass link, uint64_t bytes) {
    bytes_[int(link)].fetch_add(bytes, std::memory_order_relaxed);
  }
  uint64_t bytes(LinkClass link) const { return bytes_[int(link)].load(std::memory_order_relaxed); }
  void reset() {
    for (auto& b : bytes_) b.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> bytes_[2] = {};
};

// Where a communicator's ranks live: the node of each of its ranks (in its rank order), and the
// counters its operations add to. Empty: nothing is counted.
struct CommTopology {
  std::vector<int> node_of_rank;
  std::shared_ptr<LinkTraffic> traffic;

  // inter_node when the group spans more than one node (intra_node when no node is known).
  LinkClass link() const {
    for (int node : node_of_rank)
      if (node != node_of_rank.front()) return LinkClass::inter_node;
    return LinkClass::intra_node;
  }
  LinkClass link_between(int a, int b) const {
    return node_of_rank.at(size_t(a)) == node_of_rank.at(size_t(b)) ? LinkClass::intra_node
                                                                    : LinkClass::inter_node;
  }
  void count(LinkClass link, uint64_t bytes) const {
    if (traffic && bytes > 0) traffic->add(link, bytes);
  }
};

}  // namespace frugal
