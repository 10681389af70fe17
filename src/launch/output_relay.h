// Forwards workers' stdout and stderr to the launcher's, whole lines at a time (so ranks never
// interleave mid-line), optionally prefixed with the rank, and keeps the last lines of each
// worker's stderr for the failure report.
#pragma once

#include <deque>
#include <string>
#include <vector>

namespace accelerant::detail {

class OutputRelay {
 public:
  OutputRelay(bool prefix_with_rank, size_t tail_lines);

  /// Starts relaying `fd` (the read end of a worker's pipe; made non-blocking, closed at EOF).
  void add(int fd, int rank, bool is_stderr);
  /// Waits up to `timeout_ms` for output on the relayed pipes or on `wake_fd` (-1 for none),
  /// forwards what arrived, and returns true when `wake_fd` became readable.
  bool pump(int timeout_ms, int wake_fd = -1);
  /// Forwards what is left until every pipe is closed or `timeout_ms` passed; then closes all.
  void drain(int timeout_ms);
  /// The last lines rank `rank` wrote to stderr, newline-separated.
  std::string stderr_tail(int rank) const;
  /// Forgets all pipes and tails (before a restart).
  void reset();

 private:
  struct Stream {
    int fd;
    int rank;
    bool is_stderr;
    std::string partial;
  };
  void read_from(Stream& s);
  void emit(const Stream& s, const std::string& line);

  bool prefix_;
  size_t tail_lines_;
  std::vector<Stream> streams_;
  std::vector<std::pair<int, std::deque<std::string>>> tails_;
};

}  // namespace accelerant::detail
