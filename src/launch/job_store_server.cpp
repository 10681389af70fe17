// The job store's server: one thread polls the listening socket, a wake-up pipe and every
// connection; each connection's bytes are buffered until a whole query has arrived (a query may
// come in pieces, or several in one read). The protocol is described in job_store.h.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "accelerant/error.h"
#include "base/text.h"
#include "launch/job_store.h"
#include "launch/job_store_protocol.h"

namespace accelerant::detail {
namespace {

using namespace store_protocol;
// A string longer than this is taken for a peer that does not speak the protocol, or one that
// would grow the launcher by its size twice over (buffered, then stored), and its connection is
// closed rather than waited for. What jobs keep here is small (addresses, flags, flight records
// of a few KB); a 512 MB value used to double the launcher's memory.
constexpr uint64_t kMaxStringBytes = uint64_t{64} << 20;

// Reads a query's fields from a connection's buffered bytes. Every read returns false when the
// bytes are not all there yet; `bad` is set when the peer sent something impossible.
class QueryReader {
 public:
  explicit QueryReader(const std::string& in) : in_(in) {}
  template <class T>
  bool value(T* out) {
    if (in_.size() - at_ < sizeof(T)) return false;
    std::memcpy(out, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool string(std::string* out) {
    uint64_t size = 0;
    if (!value(&size)) return false;
    if (size > kMaxStringBytes) {
      bad = true;
      return false;
    }
    if (in_.size() - at_ < size) return false;
    out->assign(in_, at_, size);
    at_ += size;
    return true;
  }
  bool strings(std::vector<std::string>* out) {
    uint64_t count = 0;
    if (!value(&count)) return false;
    if (count > kMaxStringBytes) {
      bad = true;
      return false;
    }
    for (uint64_t i = 0; i < count; ++i) {
      std::string s;
      if (!string(&s)) return false;
      out->push_back(std::move(s));
    }
    return true;
  }
  size_t consumed() const { return at_; }
  bool bad = false;

 private:
  const std::string& in_;
  size_t at_ = 0;
};

// One query's fields, as read from a connection's bytes.
struct ParsedQuery {
  uint8_t type = 0;
  std::string key, a, b;  // a, b: kSet's value; kCompareSet's expected and desired values
  std::vector<std::string> keys;
  int64_t delta = 0;
};

enum class Arrival { kWhole, kPartial, kForeign };

// Reads the fields of query `q.type` after its type byte: kPartial while they have not all
// arrived, kForeign for a type this protocol does not have.
Arrival read_arguments(QueryReader& r, ParsedQuery& q) {
  bool whole = false;
  switch (q.type) {
    case kSet:
      whole = r.string(&q.key) && r.string(&q.a);
      break;
    case kCompareSet:
      whole = r.string(&q.key) && r.string(&q.a) && r.string(&q.b);
      break;
    case kGet:
    case kWatchKey:
    case kDeleteKey:
      whole = r.string(&q.key);
      break;
    case kAdd:
      whole = r.string(&q.key) && r.value(&q.delta);
      break;
    case kCheck:
    case kWait:
      whole = r.strings(&q.keys);
      break;
    case kGetNumKeys:
      whole = true;
      break;
    default:
      return Arrival::kForeign;
  }
  return whole ? Arrival::kWhole : Arrival::kPartial;
}

void append_value(std::string& out, const void* value, size_t size) {
  out.append(static_cast<const char*>(value), size);
}
void append_u8(std::string& out, uint8_t v) { append_value(out, &v, 1); }
void append_i64(std::string& out, int64_t v) { append_value(out, &v, 8); }
void append_string(std::string& out, const std::string& s) {
  const uint64_t size = s.size();
  append_value(out, &size, 8);
  out += s;
}

// An IPv4 socket listening on `address` (network byte order): -1 with errno when it cannot.
int listen_ipv4(int port, in_addr_t address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = address;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1024) == 0) {
    return fd;
  }
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return -1;
}

// 127.0.0.1 only: the workers are told MASTER_ADDR=127.0.0.1 (an IPv6 ::1 socket would not take
// IPv4 connections), and no other machine, container network or VPN peer can connect.
int listen_on_loopback(int port) { return listen_ipv4(port, htonl(INADDR_LOOPBACK)); }

int listen_on_every_interface(int port) {
  // Dual-stack first (IPv6 and IPv4-mapped addresses), as c10d's server does; IPv4 alone where
  // IPv6 is off.
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int on = 1, off = 0;
  if (fd >= 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1024) == 0) {
      return fd;
    }
    const int saved = errno;
    ::close(fd);
    if (saved == EADDRINUSE) {
      errno = saved;
      return -1;
    }
  }
  return listen_ipv4(port, htonl(INADDR_ANY));
}

int bound_port(int fd) {
  sockaddr_storage a{};
  socklen_t size = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

}  // namespace

struct StoreServer::Impl {
  struct Connection {
    int fd = -1;
    std::string in;  // bytes received, not yet a whole query
    bool dead = false;
  };

  int listen_fd = -1;
  int port = 0;
  int wake[2] = {-1, -1};
  std::thread thread;

  // Touched by the server thread only.
  uint64_t next_id = 0;
  std::map<uint64_t, Connection> connections;
  std::map<std::string, std::string> values;
  std::map<std::string, std::vector<uint64_t>> waiters;   // key -> connections waiting for it
  std::map<uint64_t, size_t> keys_awaited;                // connection -> keys still missing
  std::map<std::string, std::vector<uint64_t>> watchers;  // key -> connections watching it

  void run();
  void accept_one();
  void read_from(uint64_t id);
  // Handles the whole queries at the front of the connection's buffer.
  void handle(uint64_t id);
  // One query; false when it has not fully arrived.
  bool handle_one(uint64_t id, Connection& c);
  // Does what a whole query asks and replies (kWait: once its keys are all set).
  void answer(uint64_t id, ParsedQuery& q);
  // kCompareSet: what the reply carries.
  std::string compare_set(const std::string& key, const std::string& expected, std::string desired);
  // kAdd: the key's new value.
  int64_t add(const std::string& key, int64_t delta);
  // kWait: true when every key is set; else registers `id` as waiting for the missing ones.
  bool all_present_else_wait(uint64_t id, const std::vector<std::string>& keys);
  // kDeleteKey: whether the key was there.
  bool delete_key(const std::string& key);
  void reply(uint64_t id, const std::string& bytes);
  void wake_waiters(const std::string& key);
  void tell_watchers(const std::string& key, uint8_t change, const std::string& old_value,
                     const std::string& new_value);
  void store(const std::string& key, std::string value);
  void forget(uint64_t id);
};

void StoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  while (true) {
    fds.assign({{wake[0], POLLIN, 0}, {listen_fd, POLLIN, 0}});
    ids.clear();
    for (const auto& [id, c] : connections) {
      fds.push_back({c.fd, POLLIN, 0});
      ids.push_back(id);
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0) return;  // the destructor's word
    if (fds[1].revents & POLLIN) accept_one();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (fds[i + 2].revents != 0) read_from(ids[i]);
    }
    for (auto it = connections.begin(); it != connections.end();) {
      const uint64_t id = it->first;
      ++it;
      if (connections[id].dead) forget(id);
    }
  }
}

void StoreServer::Impl::accept_one() {
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  connections[next_id++].fd = fd;
}

void StoreServer::Impl::read_from(uint64_t id) {
  Connection& c = connections[id];
  char buffer[65536];
  const ssize_t n = ::recv(c.fd, buffer, sizeof buffer, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    c.dead = true;  // the client closed its end or vanished
    return;
  }
  if (n > 0) {
    c.in.append(buffer, static_cast<size_t>(n));
    handle(id);
  }
}

void StoreServer::Impl::handle(uint64_t id) {
  Connection& c = connections[id];
  while (!c.dead && !c.in.empty() && handle_one(id, c)) {
  }
}

bool StoreServer::Impl::handle_one(uint64_t id, Connection& c) {
  QueryReader r(c.in);
  ParsedQuery q;
  r.value(&q.type);
  const Arrival arrival = read_arguments(r, q);
  if (arrival == Arrival::kForeign) {
    c.dead = true;  // not the protocol this server speaks (job_store.h): drop the peer
    return false;
  }
  if (r.bad) c.dead = true;
  if (arrival != Arrival::kWhole) return false;
  c.in.erase(0, r.consumed());
  answer(id, q);
  return true;
}

void StoreServer::Impl::answer(uint64_t id, ParsedQuery& q) {
  std::string out;
  switch (q.type) {
    case kSet:
      store(q.key, std::move(q.a));
      return;  // c10d's set has no reply
    case kCompareSet:
      append_string(out, compare_set(q.key, q.a, std::move(q.b)));
      break;
    case kGet: {
      auto it = values.find(q.key);
      append_string(out, it == values.end() ? std::string() : it->second);
      break;
    }
    case kAdd:
      append_i64(out, add(q.key, q.delta));
      break;
    case kCheck: {
      bool all = true;
      for (const auto& k : q.keys) all = all && values.count(k) > 0;
      append_u8(out, all ? kReady : kNotReady);
      break;
    }
    case kWait:
      if (!all_present_else_wait(id, q.keys)) return;  // answered when the last key is set
      append_u8(out, kStopWaiting);
      break;
    case kGetNumKeys:
      append_i64(out, static_cast<int64_t>(values.size()));
      break;
    case kWatchKey:
      watchers[q.key].push_back(id);
      append_u8(out, kCallbackRegistered);
      break;
    case kDeleteKey:
      append_i64(out, delete_key(q.key) ? 1 : 0);
      break;
  }
  reply(id, out);
}

std::string StoreServer::Impl::compare_set(const std::string& key, const std::string& expected,
                                           std::string desired) {
  // As c10d 1.13 does: an absent key is created only when `expected` is empty, and the reply is
  // then the new value; otherwise the caller gets `expected` back ("lying", as c10d's own
  // comment says). A present key is replaced when it holds `expected`.
  auto it = values.find(key);
  if (it == values.end()) {
    if (!expected.empty()) return expected;
    store(key, desired);
    return desired;
  }
  if (it->second == expected) store(key, std::move(desired));
  return values[key];
}

int64_t StoreServer::Impl::add(const std::string& key, int64_t delta) {
  auto it = values.find(key);
  if (it != values.end()) {
    try {
      delta += std::stoll(it->second);
    } catch (const std::exception&) {
      // Not a number (set by someone else): counted from 0, as a fresh key would be.
    }
  }
  store(key, std::to_string(delta));
  return delta;
}

bool StoreServer::Impl::all_present_else_wait(uint64_t id, const std::vector<std::string>& keys) {
  size_t missing = 0;
  for (const auto& k : keys) {
    if (values.count(k) == 0) {
      waiters[k].push_back(id);
      ++missing;
    }
  }
  if (missing != 0) keys_awaited[id] = missing;
  return missing == 0;
}

bool StoreServer::Impl::delete_key(const std::string& key) {
  auto it = values.find(key);
  if (it == values.end()) return false;
  const std::string old = std::move(it->second);
  values.erase(it);
  tell_watchers(key, kKeyDeleted, old, "");
  return true;
}

void StoreServer::Impl::store(const std::string& key, std::string value) {
  auto it = values.find(key);
  const bool created = it == values.end();
  const std::string old = created ? std::string() : it->second;
  values[key] = std::move(value);
  wake_waiters(key);
  tell_watchers(key, created ? kKeyCreated : kKeyUpdated, old, values[key]);
}

void StoreServer::Impl::reply(uint64_t id, const std::string& bytes) {
  auto it = connections.find(id);
  if (it == connections.end() || it->second.dead) return;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(it->second.fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      it->second.dead = true;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

void StoreServer::Impl::wake_waiters(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  const std::vector<uint64_t> ids = std::move(it->second);
  waiters.erase(it);
  for (uint64_t id : ids) {
    auto awaited = keys_awaited.find(id);
    if (awaited == keys_awaited.end()) continue;
    if (--awaited->second == 0) {
      keys_awaited.erase(awaited);
      std::string out;
      append_u8(out, kStopWaiting);
      reply(id, out);
    }
  }
}

void StoreServer::Impl::tell_watchers(const std::string& key, uint8_t change,
                                      const std::string& old_value, const std::string& new_value) {
  auto it = watchers.find(key);
  if (it == watchers.end()) return;
  std::string out;
  append_u8(out, change);
  append_string(out, key);
  append_string(out, old_value);
  append_string(out, new_value);
  for (uint64_t id : it->second) reply(id, out);
}

void StoreServer::Impl::forget(uint64_t id) {
  auto it = connections.find(id);
  if (it == connections.end()) return;
  ::close(it->second.fd);
  connections.erase(it);
  keys_awaited.erase(id);
  for (auto* table : {&waiters, &watchers}) {
    for (auto entry = table->begin(); entry != table->end();) {
      auto& list = entry->second;
      list.erase(std::remove(list.begin(), list.end(), id), list.end());
      entry = list.empty() ? table->erase(entry) : std::next(entry);
    }
  }
}

StoreServer::StoreServer(int port, StoreReach reach) : impl_(std::make_unique<Impl>()) {
  impl_->listen_fd = reach == StoreReach::kThisMachine ? listen_on_loopback(port)
                                                       : listen_on_every_interface(port);
  if (impl_->listen_fd < 0) {
    throw Error(str("cannot listen on port ", port, ": ", std::strerror(errno)));
  }
  impl_->port = bound_port(impl_->listen_fd);
  if (::pipe2(impl_->wake, O_CLOEXEC) != 0) {
    ::close(impl_->listen_fd);
    throw Error(str("cannot create a pipe for the store's thread: ", std::strerror(errno)));
  }
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

StoreServer::~StoreServer() {
  const char stop = 0;
  (void)!::write(impl_->wake[1], &stop, 1);
  impl_->thread.join();
  for (auto& [id, c] : impl_->connections) ::close(c.fd);
  ::close(impl_->listen_fd);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

int StoreServer::port() const { return impl_->port; }

}  // namespace accelerant::detail
