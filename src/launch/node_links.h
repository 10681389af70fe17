// Liveness between the launchers of a multi-node job: every node's launcher holds one TCP
// connection to node 0's launcher (a star), opened when the job starts and kept until the end.
//
// Why a connection of our own and not heartbeats through the store: when a launcher dies, even by
// SIGKILL, the kernel closes its sockets, so its peer sees the loss within one monitor interval
// instead of after a heartbeat timeout; and a machine that vanishes without closing anything
// (power, cable) is caught by TCP keep-alive within about 11 s. The store has no way to tell its
// host that a client went away. See docs/launching.md "Several machines".
//
// The handshake also checks that every node was started with the same job shape (machines,
// processes per machine), which would otherwise surface as a rendezvous timeout much later.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace accelerant::detail {

/// What a node says about itself when it connects.
struct NodeShape {
  int node_rank = 0;
  int num_nodes = 1;
  int local_processes = 1;
};

class NodeLinks {
 public:
  using Clock = std::chrono::steady_clock;

  NodeLinks() = default;
  ~NodeLinks();
  NodeLinks(NodeLinks&& other) noexcept;
  NodeLinks& operator=(NodeLinks&& other) noexcept;
  NodeLinks(const NodeLinks&) = delete;
  NodeLinks& operator=(const NodeLinks&) = delete;

  /// Node 0: listens on a free port on every interface. Throws LaunchError when it cannot.
  static NodeLinks listen(const NodeShape& self);
  /// The port listen() chose, for the other nodes to find through the store.
  int port() const { return port_; }
  /// Node 0: accepts the other nodes until `wanted` of them are connected (-1: all) or
  /// `deadline`; refuses (with a message to the connecting node) a node whose shape differs or
  /// whose rank is taken. Returns the node ranks still missing (empty when all are connected).
  /// Throws LaunchError, naming both shapes, when a node was started with a different job shape.
  std::vector<int> accept_nodes(Clock::time_point deadline, int wanted = -1);
  /// Node r > 0: connects to node 0's launcher at host:port and introduces itself, retrying until
  /// `deadline`. Throws LaunchError when node 0 refuses it (shape or rank) or cannot be reached.
  static NodeLinks connect(const std::string& host, int port, const NodeShape& self,
                           Clock::time_point deadline);

  /// Without blocking: the node ranks whose connection broke since the last call. On node 0 any
  /// other node; on the others, node 0.
  std::vector<int> lost();
  /// Node 0: the connected nodes that have not yet closed their end.
  std::vector<int> connected() const;
  /// Closes every connection and the listening socket.
  void close_all();

 private:
  struct Peer {
    int node_rank;
    int fd;
  };
  NodeShape self_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<Peer> peers_;
};

}  // namespace accelerant::detail
