// Forwards workers' stdout and stderr to the launcher's, whole lines at a time (so ranks never
// interleave mid-line), optionally prefixed with the rank, and keeps the last lines of each
// worker's stderr for the failure report. Bounded: a line longer than kMaxHeldLine goes out in
// pieces of that size (each a line of its own on the console, unbroken in the log), and a segment
// ended by '\r' (a progress display redrawing its line) goes out at once with its '\r'. Log
// files and the stderr tail get lines only: of the redraws before a line's end they keep the last,
// what a terminal would show when the line ended (see emit()).
#pragma once

#include <cstdio>
#include <deque>
#include <string>
#include <vector>

namespace accelerant::detail {

class OutputRelay {
 public:
  /// The most of one line held back waiting for its end: bounds the launcher's memory per pipe
  /// and its work per byte whatever a worker writes.
  static constexpr size_t kMaxHeldLine = 64 * 1024;

  /// With a `log_dir`, every line also goes to <log_dir>/attempt_<n>/rank_<r>.stdout|stderr, and
  /// to the console only when `tee` is set.
  /// With `prefix_with_rank`, console lines start with rank_prefix(rank, world_size).
  OutputRelay(bool prefix_with_rank, int world_size, size_t tail_lines, std::string log_dir = "",
              bool tee = false);
  ~OutputRelay();

  /// Creates the log directory and checks that a file can be written in it; throws LaunchError
  /// naming the directory and the reason otherwise. Nothing to do without a log_dir.
  void check_log_dir() const;
  /// Starts relaying `fd` (the read end of a worker's pipe; made non-blocking, closed at EOF).
  void add(int fd, int rank, bool is_stderr);
  /// Waits up to `timeout_ms` for output on the relayed pipes or on `wake_fd` (-1 for none),
  /// forwards what arrived, and returns true when `wake_fd` became readable.
  bool pump(int timeout_ms, int wake_fd = -1);
  /// Forwards what is left until every pipe is closed or `timeout_ms` passed; then closes all.
  void drain(int timeout_ms);
  /// Which worker streams reach a terminal through this relay: "none", "stdout", "stderr" or
  /// "both" (the workers' ACCELERANT_CONSOLE_TERMINAL). None while a log_dir takes the output
  /// without tee.
  std::string console_terminal() const;
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
    std::string partial;        // the start of a line, at most kMaxHeldLine bytes
    bool after_cr = false;      // the last byte relayed was a '\r'
    std::string last_update{};  // the last '\r'-ended segment since the last line, at most
                                // kMaxHeldLine bytes: logged when the line ends
    bool log_failed = false;    // its log file could not be opened (said once)
  };
  // How a relayed segment ended: '\n', '\r', or kBroken (a piece of an overlong line, or the
  // last bytes before EOF without a newline).
  static constexpr char kBroken = 0;
  void read_from(Stream& s);
  void emit(Stream& s, const std::string& text, char end);
  void finish(Stream& s);
  bool to_console(const Stream& s) const;

  void log(Stream& s, const std::string& text, char end);
  void write_to_console(const Stream& s, const std::string& text, char end);
  void write_all(const Stream& s, const std::string& out);
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
