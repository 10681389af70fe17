// The job store's client, as the launchers use it (NodeGroup). Keys get c10d's "/" prefix, so that
// this client and the workers' c10d::TCPStore clients see the same keys.
#include <fcntl.h>
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

#include "accelerant/error.h"
#include "base/deadline.h"
#include "base/text.h"
#include "launch/job_store.h"
#include "launch/job_store_protocol.h"

namespace accelerant::detail {
namespace {

using namespace store_protocol;
const char* const kKeyPrefix = "/";

void append_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

// A blocking connection to `a`, tried until `deadline`: a blocking connect() to an address that
// does not answer (packets dropped by a firewall, a machine that is down) waits for the kernel's
// SYN retries, about two minutes, whatever the join timeout says. -1 and `error` otherwise.
int connect_before(const addrinfo& a, StoreClient::Clock::time_point deadline, std::string& error) {
  const int fd = ::socket(a.ai_family, a.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a.ai_protocol);
  if (fd < 0) {
    error = std::strerror(errno);
    return -1;
  }
  int failure = ::connect(fd, a.ai_addr, a.ai_addrlen) == 0 ? 0 : errno;
  if (failure == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int ready;
    do {
      ready = ::poll(&p, 1, std::max(1, poll_timeout_ms(deadline)));
    } while (ready < 0 && errno == EINTR);
    socklen_t size = sizeof failure;
    if (ready <= 0) {
      failure = ETIMEDOUT;
    } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &failure, &size) != 0) {
      failure = errno;
    }
  }
  if (failure != 0) {
    error = failure == ETIMEDOUT ? "no answer (connection timed out)" : std::strerror(failure);
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

StoreClient::StoreClient(const std::string& host, int port,
                         std::chrono::milliseconds connect_timeout,
                         std::chrono::milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
  connect(Clock::now() + connect_timeout);
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StoreClient::connect(Clock::time_point deadline) {
  std::string last_error = "the deadline passed before a connection was tried";
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found);
    if (rc != 0) {
      last_error = str("cannot resolve ", host_, ": ", ::gai_strerror(rc));
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = connect_before(*a, deadline, last_error);
        if (fd < 0) continue;
        int on = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
        ::freeaddrinfo(found);
        fd_ = fd;
        return;
      }
      ::freeaddrinfo(found);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, poll_timeout_ms(deadline))));
  }
  throw Error(str("cannot connect to the job's store at ", host_, ":", port_, ": ", last_error));
}

void StoreClient::send_all(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw Error(
          str("the job's store at ", host_, ":", port_, " went away: ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
}

void StoreClient::send_query(uint8_t type, const std::vector<std::string>& strings,
                             bool with_count) {
  std::string out(1, static_cast<char>(type));
  if (with_count) append_u64(out, strings.size());
  for (const auto& s : strings) {
    append_u64(out, s.size());
    out += s;
  }
  send_all(out);
}

bool StoreClient::receive(void* into, size_t size, Clock::time_point deadline) {
  auto* at = static_cast<char*>(into);
  size_t got = 0;
  while (got < size) {
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return false;
    const ssize_t n = ::recv(fd_, at + got, size - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw Error(str("the job's store at ", host_, ":", port_, " closed the connection",
                      n < 0 ? str(" (", std::strerror(errno), ")") : std::string()));
    }
    got += static_cast<size_t>(n);
  }
  return true;
}

std::string StoreClient::receive_string() {
  const auto deadline = Clock::now() + timeout_;
  uint64_t size = 0;
  std::string value;
  if (receive(&size, 8, deadline)) {
    value.resize(size);
    if (size == 0 || receive(value.data(), size, deadline)) return value;
  }
  throw Error(str("the job's store at ", host_, ":", port_, " did not answer within ",
                  timeout_.count(), " ms"));
}

void StoreClient::set(const std::string& key, const std::string& value) {
  send_query(kSet, {kKeyPrefix + key, value}, false);
}

std::string StoreClient::get(const std::string& key) {
  wait({key}, timeout_);
  send_query(kGet, {kKeyPrefix + key}, false);
  return receive_string();
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  std::string out(1, static_cast<char>(kAdd));
  const std::string k = kKeyPrefix + key;
  append_u64(out, k.size());
  out += k;
  out.append(reinterpret_cast<const char*>(&delta), 8);
  send_all(out);
  int64_t sum = 0;
  if (!receive(&sum, 8, Clock::now() + timeout_)) {
    throw Error(str("the job's store at ", host_, ":", port_, " did not answer within ",
                    timeout_.count(), " ms"));
  }
  return sum;
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  std::vector<std::string> prefixed;
  for (const auto& k : keys) prefixed.push_back(kKeyPrefix + k);
  send_query(kCheck, prefixed, true);
  uint8_t answer = 0;
  if (!receive(&answer, 1, Clock::now() + timeout_)) {
    throw Error(str("the job's store at ", host_, ":", port_, " did not answer within ",
                    timeout_.count(), " ms"));
  }
  return answer == kReady;
}

void StoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> prefixed;
  for (const auto& k : keys) prefixed.push_back(kKeyPrefix + k);
  send_query(kWait, prefixed, true);
  uint8_t answer = 0;
  if (receive(&answer, 1, Clock::now() + timeout)) return;
  // The 1.13 protocol cannot cancel a wait: the server would answer it later, in the middle of
  // another reply. A new connection leaves the old one's answer behind.
  ::close(fd_);
  fd_ = -1;
  connect(Clock::now() + timeout_);
  throw Error(str("timed out after ", timeout.count(), " ms waiting for the job's store at ", host_,
                  ":", port_, " to hold ", join(keys, ", ")));
}

}  // namespace accelerant::detail
