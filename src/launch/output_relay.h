// Forwards workers' stdout and stderr to the launcher's, whole lines at a time (so ranks never
// interleave mid-line), optionally prefixed with the rank, and keeps the last lines of each
// worker's stderr for the failure report.
#pragma once

#include <cstdio>
#include <deque>
#include <string>
#include <vector>

namespace accelerant::detail {

class OutputRelay {
 public:
  /// With a `log_dir`, every line also goes to <log_dir>/attempt_<n>/rank_<r>.stdout|stderr, and
  /// to the console only when `tee` is set.
  /// With `prefix_with_rank`, console lines start with rank_prefix(rank, world_size).
  OutputRelay(bool prefix_with_rank, int world_size, size_t tail_lines, std::string log_dir = "",
              bool tee = false);
  ~OutputRelay();

  /// Starts relaying `fd` (the read end of a worker's pipe; made non-blocking, closed at EOF).
  void add(int fd, int rank, bool is_stderr);
  /// Waits up to `timeout_ms` for output on the relayed pipes or on `wake_fd` (-1 for none),
  /// forwards what arrived, and returns true when `wake_fd` became readable.
  bool pump(int timeout_ms, int wake_fd = -1);
  /// Forwards what is left until every pipe is closed or `timeout_ms` passed; then closes all.
  void drain(int timeout_ms);
  /// The last lines rank `rank` wrote to stderr, newline-separated.
  std::string stderr_tail(int rank) const;
  /// Forgets all pipes and tails and closes the log files (before a restart); later lines are
  /// logged under attempt `attempt`.
  void reset(int attempt = 0);

 private:
  struct Stream {
    int fd;
    int rank;
    bool is_stderr;
    std::string partial;
  };
  void read_from(Stream& s);
  void emit(const Stream& s, const std::string& line);

  void log(const Stream& s, const std::string& line);
  void write_to_console(const Stream& s, const std::string& line);
  void remember_tail(const Stream& s, const std::string& line);
  bool prefix_;
  int world_size_;
  size_t tail_lines_;
  std::string log_dir_;
  bool tee_;
  int attempt_ = 0;
  std::vector<std::pair<std::pair<int, bool>, std::FILE*>> log_files_;  // (rank, is_stderr) -> file
  std::vector<Stream> streams_;
  std::vector<std::pair<int, std::deque<std::string>>> tails_;
};

}  // namespace accelerant::detail
