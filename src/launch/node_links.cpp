#include "launch/node_links.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "accelerant/error.h"
#include "base/deadline.h"
#include "base/text.h"

namespace accelerant::detail {
namespace {

constexpr char kMagic[8] = {'A', 'C', 'C', 'L', 'I', 'N', 'K', '1'};
constexpr size_t kHelloSize = sizeof(kMagic) + 3 * 4;
constexpr size_t kReplySize = 1 + 2 * 4;
// Replies to a connecting node.
constexpr char kAccepted = 'Y', kOtherShape = 'S', kRankTaken = 'D', kRankOutOfRange = 'R';

void put_int(char* at, int value) {
  const uint32_t net = htonl(static_cast<uint32_t>(value));
  std::memcpy(at, &net, 4);
}

int get_int(const char* at) {
  uint32_t net;
  std::memcpy(&net, at, 4);
  return static_cast<int>(ntohl(net));
}

// A dead machine never closes its end; keep-alive probes find it: 5 s idle, then 3 probes 2 s
// apart, so about 11 s after the last sign of life.
void enable_keepalive(int fd) {
  int on = 1, idle = 5, interval = 2, count = 3;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

// Reads exactly `size` bytes before `deadline`; false on EOF, error or time-out.
bool read_exactly(int fd, char* buffer, size_t size, NodeLinks::Clock::time_point deadline) {
  size_t got = 0;
  while (got < size) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = ::recv(fd, buffer + got, size - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

std::string shape_text(int num_nodes, int local_processes) {
  return str(num_nodes, " machine(s) with ", local_processes, " process(es) each");
}

void send_reply(int fd, char code, const NodeShape& self) {
  char reply[kReplySize];
  reply[0] = code;
  put_int(reply + 1, self.num_nodes);
  put_int(reply + 5, self.local_processes);
  write_all(fd, reply, sizeof reply);
}

// Opens a TCP connection to host:port, retrying refused connections until `deadline`
// (node 0 may not be listening yet). Returns -1 when the deadline passed; `last_error` says why.
int connect_until(const std::string& host, int port, NodeLinks::Clock::time_point deadline,
                  std::string& last_error) {
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0) {
      last_error = str("cannot resolve ", host, ": ", ::gai_strerror(rc));
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(found);
          return fd;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(found);
    }
    if (NodeLinks::Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

NodeLinks::~NodeLinks() { close_all(); }

NodeLinks::NodeLinks(NodeLinks&& other) noexcept { *this = std::move(other); }

NodeLinks& NodeLinks::operator=(NodeLinks&& other) noexcept {
  if (this != &other) {
    close_all();
    self_ = other.self_;
    listen_fd_ = std::exchange(other.listen_fd_, -1);
    port_ = other.port_;
    peers_ = std::move(other.peers_);
    other.peers_.clear();
  }
  return *this;
}

NodeLinks NodeLinks::listen(const NodeShape& self) {
  NodeLinks links;
  links.self_ = self;
  // IPv6 with IPV6_V6ONLY off accepts IPv4 too; fall back to IPv4 where IPv6 is disabled.
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int off = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 any{};
    any.sin6_family = AF_INET6;
    any.sin6_addr = in6addr_any;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0) {
      const std::string why = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      throw LaunchError(
          str("accelerant launch (node 0): cannot open a port for the other machines' "
              "launchers: ",
              why,
              ". Fix: check that this machine allows listening "
              "TCP sockets."));
    }
  }
  ::listen(fd, 64);
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  links.port_ = bound.ss_family == AF_INET6
                    ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                    : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  links.listen_fd_ = fd;
  return links;
}

std::vector<int> NodeLinks::accept_nodes(Clock::time_point deadline, int wanted) {
  if (wanted < 0) wanted = self_.num_nodes - 1;
  auto missing = [this] {
    std::vector<int> ranks;
    for (int r = 1; r < self_.num_nodes; ++r) {
      if (std::none_of(peers_.begin(), peers_.end(),
                       [r](const Peer& p) { return p.node_rank == r; })) {
        ranks.push_back(r);
      }
    }
    return ranks;
  };
  while (static_cast<int>(peers_.size()) < wanted) {
    pollfd p{listen_fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, std::min(poll_timeout_ms(deadline), 100));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) {
      if (Clock::now() >= deadline) break;
      continue;
    }
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char hello[kHelloSize];
    // A connection that is not one of our launchers (a port scanner, a stale job) is dropped.
    // Its own deadline: accepting without waiting (deadline now) still reads a launcher's hello.
    if (!read_exactly(fd, hello, sizeof hello, Clock::now() + std::chrono::seconds(5)) ||
        std::memcmp(hello, kMagic, sizeof kMagic) != 0) {
      ::close(fd);
      continue;
    }
    const int rank = get_int(hello + 8), nodes = get_int(hello + 12), local = get_int(hello + 16);
    if (nodes != self_.num_nodes || local != self_.local_processes) {
      send_reply(fd, kOtherShape, self_);
      ::close(fd);
      throw LaunchError(
          str("accelerant launch (node 0): machine ", rank, " was started for ",
              shape_text(nodes, local), ", this machine for ",
              shape_text(self_.num_nodes, self_.local_processes),
              ". Likely cause: different --world_size or --num_nodes (or config files) on the "
              "machines. Fix: start every machine with the same --num_nodes and --world_size "
              "(the total across machines)."));
    }
    const bool taken = std::any_of(peers_.begin(), peers_.end(),
                                   [rank](const Peer& p) { return p.node_rank == rank; });
    if (rank < 1 || rank >= self_.num_nodes || taken) {
      send_reply(fd, taken ? kRankTaken : kRankOutOfRange, self_);
      ::close(fd);
      continue;  // that launcher reports it; this job keeps waiting for the real one
    }
    send_reply(fd, kAccepted, self_);
    enable_keepalive(fd);
    peers_.push_back({rank, fd});
  }
  return missing();
}

NodeLinks NodeLinks::connect(const std::string& host, int port, const NodeShape& self,
                             Clock::time_point deadline) {
  std::string why;
  const int fd = connect_until(host, port, deadline, why);
  const std::string where = str(host, ":", port);
  if (fd < 0) {
    throw LaunchError(
        str("accelerant launch (machine ", self.node_rank,
            "): cannot connect to machine 0's "
            "launcher at ",
            where, ": ", why,
            ". Likely cause: the job on machine 0 has "
            "already started with every machine, or a firewall blocks the port. Fix: "
            "start every machine's launcher at the same time, with the same settings."));
  }
  char hello[kHelloSize];
  std::memcpy(hello, kMagic, sizeof kMagic);
  put_int(hello + 8, self.node_rank);
  put_int(hello + 12, self.num_nodes);
  put_int(hello + 16, self.local_processes);
  char reply[kReplySize];
  if (!write_all(fd, hello, sizeof hello) || !read_exactly(fd, reply, sizeof reply, deadline)) {
    ::close(fd);
    throw LaunchError(str("accelerant launch (machine ", self.node_rank,
                          "): machine 0's launcher at ", where,
                          " did not answer. Likely cause: it stopped, or it already runs with "
                          "another machine in this rank. Fix: restart the job on every machine."));
  }
  const int their_nodes = get_int(reply + 1), their_local = get_int(reply + 5);
  if (reply[0] != kAccepted) {
    ::close(fd);
    if (reply[0] == kOtherShape) {
      throw LaunchError(str("accelerant launch (machine ", self.node_rank,
                            "): machine 0 was started for ", shape_text(their_nodes, their_local),
                            ", this machine for ", shape_text(self.num_nodes, self.local_processes),
                            ". Fix: start every machine with the same --num_nodes and "
                            "--world_size (the total across machines)."));
    }
    throw LaunchError(str("accelerant launch (machine ", self.node_rank,
                          "): machine 0 refused node_rank ", self.node_rank, ": ",
                          reply[0] == kRankTaken ? "another launcher already joined with it"
                                                 : "it is outside 1..num_nodes - 1",
                          ". Fix: give every machine its own --node_rank, 0 to ",
                          self.num_nodes - 1, "."));
  }
  enable_keepalive(fd);
  NodeLinks links;
  links.self_ = self;
  links.peers_.push_back({0, fd});
  return links;
}

std::vector<int> NodeLinks::lost() {
  std::vector<int> gone;
  for (auto it = peers_.begin(); it != peers_.end();) {
    pollfd p{it->fd, POLLIN, 0};
    bool broken = false;
    if (::poll(&p, 1, 0) > 0) {
      char sink[64];
      const ssize_t n = ::recv(it->fd, sink, sizeof sink, MSG_DONTWAIT);
      broken = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
               (p.revents & (POLLERR | POLLHUP)) != 0;
    }
    if (broken) {
      gone.push_back(it->node_rank);
      ::close(it->fd);
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

std::vector<int> NodeLinks::connected() const {
  std::vector<int> ranks;
  for (const auto& p : peers_) ranks.push_back(p.node_rank);
  return ranks;
}

void NodeLinks::close_all() {
  for (const auto& p : peers_) ::close(p.fd);
  peers_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

}  // namespace accelerant::detail
