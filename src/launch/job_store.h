// The job's key-value store without LibTorch: a server the launcher's agent hosts and a client
// with the calls the launchers make of it (NodeGroup). The workers reach the same server with
// LibTorch's own c10d::TCPStore client (comm/process_state.cpp, Gloo's rendezvous), so the server
// speaks c10d's wire protocol; the client speaks it too, so that it also reaches a c10d server.
//
// The protocol is the one of LibTorch 1.10 to 1.13 (Debian's libtorch 1.13.1;
// torch/csrc/distributed/c10d/TCPStore.cpp). Every integer is in the host's byte order (c10d
// sends raw memory; all its platforms are little-endian):
//   a query    u8 type, then its arguments
//   a string   u64 length, then the bytes (keys and values alike)
//   SET 0          key, value                 no reply; wakes waiters, tells watchers
//   COMPARE_SET 1  key, expected, desired     reply: string, the value now held (see the handler)
//   GET 2          key                        reply: string (c10d clients WAIT for it first)
//   ADD 3          key, i64 delta             reply: i64 sum; the value is kept as decimal text
//   CHECK 4        u64 n, n keys              reply: u8 0 READY (all exist) or 1 NOT_READY
//   WAIT 5         u64 n, n keys              reply: u8 0 STOP_WAITING once all exist (maybe
//                                             much later; a client that gives up closes or
//                                             ignores it: there is no cancel in 1.13)
//   GETNUMKEYS 6   -                          reply: i64
//   WATCH_KEY 7    key                        reply: u8 3 KEY_CALLBACK_REGISTERED; then, on every
//                                             change of the key: u8 0 UPDATED / 1 CREATED /
//                                             2 DELETED, key, old value, new value
//   DELETE_KEY 8   key                        reply: i64 keys deleted (0 or 1)
// c10d clients prefix every key with "/" and open two connections each (queries, watch
// callbacks); the server needs no handshake.
// LibTorch 2.x changed the protocol (a magic number on every query, new query types, CANCEL_WAIT),
// so a 2.x worker cannot talk to this server (it would be disconnected at its first query). A
// build against 2.x knows it at compile time (base/torch_version.h): then the launcher on one
// machine does not host the workers' store and rank 0 hosts c10d's own (as under torchrun without
// its agent store), and a job on several machines is refused with the reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace accelerant::detail {

/// Who can connect to the store (docs/security.md).
enum class StoreReach {
  kThisMachine,  ///< 127.0.0.1 only: a job on one machine
  kNetwork,      ///< every interface, IPv4 and IPv6: the other machines' launchers and workers
};

/// Serves the job's store on a background thread until destroyed.
class StoreServer {
 public:
  /// Listens on `port` (0 = a free port chosen by the operating system) where `reach` says.
  /// Throws Error when the port cannot be bound (taken by another job).
  StoreServer(int port, StoreReach reach);
  /// Stops the thread and closes every connection (clients see the store go away).
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  /// The port it listens on.
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One connection to a store (ours or c10d's). Not thread-safe: one caller at a time.
class StoreClient {
 public:
  using Clock = std::chrono::steady_clock;

  /// Connects to host:port, retrying refused connections until `connect_timeout` has passed (the
  /// server may not be up yet). `timeout` bounds every later call. Throws Error when no connection
  /// could be made.
  StoreClient(const std::string& host, int port, std::chrono::milliseconds connect_timeout,
              std::chrono::milliseconds timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  void set(const std::string& key, const std::string& value);
  /// Waits (up to the timeout) until `key` exists, then returns its value.
  std::string get(const std::string& key);
  /// Adds `delta` to the integer held at `key` (0 when absent) and returns the sum.
  int64_t add(const std::string& key, int64_t delta);
  /// Whether every key exists.
  bool check(const std::vector<std::string>& keys);
  /// Returns once every key exists; throws Error after `timeout`.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

 private:
  void connect(Clock::time_point deadline);
  void send_query(uint8_t type, const std::vector<std::string>& strings, bool with_count);
  void send_all(const std::string& bytes);
  // Reads exactly `size` bytes before `deadline`; false on time-out; throws when the store is gone.
  bool receive(void* into, size_t size, Clock::time_point deadline);
  std::string receive_string();

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
};

}  // namespace accelerant::detail
