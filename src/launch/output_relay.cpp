#include "launch/output_relay.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "accelerant/error.h"
#include "base/text.h"

namespace accelerant::detail {

OutputRelay::OutputRelay(bool prefix_with_rank, int world_size, size_t tail_lines,
                         std::string log_dir, bool tee)
    : prefix_(prefix_with_rank),
      world_size_(world_size),
      tail_lines_(tail_lines),
      log_dir_(std::move(log_dir)),
      tee_(tee) {}

OutputRelay::~OutputRelay() {
  for (auto& entry : log_files_) std::fclose(entry.second);
}

void OutputRelay::check_log_dir() const {
  if (log_dir_.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(log_dir_, error);
  std::string reason = error ? error.message() : "";
  if (reason.empty()) {
    std::string probe = log_dir_ + "/.accelerant-write-check-XXXXXX";
    const int fd = ::mkstemp(probe.data());
    if (fd < 0) {
      reason = std::strerror(errno);
    } else {
      ::close(fd);
      ::unlink(probe.c_str());
    }
  }
  if (reason.empty()) return;
  throw LaunchError(str("accelerant::launch: cannot write the workers' logs in log_dir ", log_dir_,
                        ": ", reason,
                        ". No worker was started, as their output would be lost. Likely cause: a "
                        "path through a file, a read-only file system or no permission. Fix: give "
                        "a directory you can write (accelerant launch --log_dir), or no log_dir "
                        "to see the output on the console."));
}

void OutputRelay::log(Stream& s, const std::string& text, char end) {
  std::FILE* file = nullptr;
  for (auto& [key, f] : log_files_) {
    if (key.first == s.rank && key.second == s.is_stderr) file = f;
  }
  if (file == nullptr) {
    const std::string dir = log_dir_ + "/attempt_" + std::to_string(attempt_);
    ::mkdir(log_dir_.c_str(), 0755);
    ::mkdir(dir.c_str(), 0755);
    const std::string path =
        dir + "/rank_" + std::to_string(s.rank) + (s.is_stderr ? ".stderr" : ".stdout");
    file = std::fopen(path.c_str(), "a");
    if (file == nullptr) {
      // Checked before the start (check_log_dir), so the disk filled up or the directory went.
      const std::string warning =
          str("accelerant::launch: cannot write ", path, ": ", std::strerror(errno), "; rank ",
              s.rank, "'s output goes to the console instead.\n");
      (void)!::write(STDERR_FILENO, warning.data(), warning.size());
      s.log_failed = true;
      return;
    }
    log_files_.push_back({{s.rank, s.is_stderr}, file});
  }
  // Flushed at every line: a crash of the launcher must not lose a worker's last lines. A write
  // that fails (the disk filled up: ENOSPC) is said once, and this stream's output, this line
  // included, goes to the console from then on (emit checks log_failed after this call).
  errno = 0;
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size() &&
                       (end == kBroken || std::fputc(end, file) != EOF) && std::fflush(file) == 0;
  if (!written) {
    const int error = errno;
    const std::string warning = str(
        "accelerant::launch: cannot write rank ", s.rank, "'s ", s.is_stderr ? "stderr" : "stdout",
        " to its log in ", log_dir_, ": ", error ? std::strerror(error) : "write failed",
        "; its output goes to the console from here on. Fix: free space on that disk, or give "
        "--log_dir on another.\n");
    (void)!::write(STDERR_FILENO, warning.data(), warning.size());
    s.log_failed = true;
  }
}

void OutputRelay::add(int fd, int rank, bool is_stderr) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  streams_.push_back({fd, rank, is_stderr, {}});
}

bool OutputRelay::to_console(const Stream& s) const {
  return log_dir_.empty() || tee_ || s.log_failed;
}

// A progress display redraws its line: "10%\r20%\r...100%\r\n", or "...\r100% done\n". The
// console gets every redraw at once, as that is what the user watches. A log file or the failure
// report's tail that kept every redraw would fill with thousands of copies of one line (a redraw
// every 0.1 s is 36,000 an hour) of which a reader wants the last, so they get one line when the
// line ends: its own text, or when that is empty ("\r\n"), the last redraw, which is what a
// terminal shows at that moment.
void OutputRelay::emit(Stream& s, const std::string& text, char end) {
  if (end == '\r') {
    // An empty segment moves nothing: the console's cursor is at a line's start after every
    // segment the relay writes. Written, it would show a bare rank prefix ("[rank 0/2] \r")
    // before each redraw of a display that starts its redraws with '\r'.
    if (to_console(s) && !text.empty()) write_to_console(s, text, end);
    if (!text.empty()) s.last_update = text;
    s.after_cr = true;
    return;
  }
  const std::string& line = text.empty() ? s.last_update : text;
  if (!log_dir_.empty() && !s.log_failed) log(s, line, end);
  if (to_console(s)) {
    if (end == '\n' && s.after_cr && text.empty()) {
      write_all(s, "\n");  // the '\n' of "\r\n": the line went out with its '\r' already
    } else {
      write_to_console(s, text, end);
    }
  }
  remember_tail(s, line);
  s.last_update.clear();
  s.after_cr = false;
}

// The stream ended (EOF, or the relay stops): what it held goes out.
void OutputRelay::finish(Stream& s) {
  if (!s.partial.empty()) {
    emit(s, s.partial, kBroken);
  } else if (!s.last_update.empty()) {
    // The last output was a redraw, already on the console; the log and the tail still lack it.
    if (!log_dir_.empty() && !s.log_failed) log(s, s.last_update, '\n');
    remember_tail(s, s.last_update);
  }
  s.partial.clear();
  s.last_update.clear();
  s.after_cr = false;
}

std::string OutputRelay::console_terminal() const {
  if (!log_dir_.empty() && !tee_) return "none";
  const bool out = ::isatty(STDOUT_FILENO) == 1, err = ::isatty(STDERR_FILENO) == 1;
  return out && err ? "both" : out ? "stdout" : err ? "stderr" : "none";
}

void OutputRelay::write_to_console(const Stream& s, const std::string& text, char end) {
  // A line the worker already prefixed with its rank (the library's own messages do) keeps the
  // one prefix: "[rank 1/2] [rank 1/2] ..." said nothing more.
  const std::string prefix = prefix_ ? rank_prefix(s.rank, world_size_) : "";
  std::string out = text.compare(0, prefix.size(), prefix) == 0 ? text : prefix + text;
  out += end == '\r' ? '\r' : '\n';
  write_all(s, out);
}

void OutputRelay::write_all(const Stream& s, const std::string& out) {
  const int target = s.is_stderr ? STDERR_FILENO : STDOUT_FILENO;
  for (size_t done = 0; done < out.size();) {
    ssize_t n = ::write(target, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // our own output is gone (closed pipe): keep relaying for the tail
    done += static_cast<size_t>(n);
  }
}

void OutputRelay::remember_tail(const Stream& s, const std::string& line) {
  if (!s.is_stderr || tail_lines_ == 0) return;
  for (auto& [rank, lines] : tails_) {
    if (rank != s.rank) continue;
    lines.push_back(line);
    if (lines.size() > tail_lines_) lines.pop_front();
    return;
  }
  tails_.push_back({s.rank, {line}});
}

// Each byte is looked at once, and at most kMaxHeldLine of them are held: O(n) whatever the
// worker writes (appending every read to one growing line and searching it again took minutes and
// gigabytes for a 300 MB line without a newline).
void OutputRelay::read_from(Stream& s) {
  char buffer[16384];
  // At most 64 reads (1 MiB) per call: a worker that never stops writing must not keep the agent
  // from its other pipes, its signals and its workers; poll reports the rest at once.
  for (int reads = 0; reads < 64; ++reads) {
    ssize_t n = ::read(s.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: nothing more for now
    if (n == 0) {       // EOF: the worker (and anything that inherited its pipe) is gone
      finish(s);
      ::close(s.fd);
      s.fd = -1;
      return;
    }
    const char* at = buffer;
    const char* const stop = buffer + n;
    while (at < stop) {
      const char* end = at;
      while (end < stop && *end != '\n' && *end != '\r') ++end;
      const size_t room = kMaxHeldLine - s.partial.size();
      if (static_cast<size_t>(end - at) > room) {  // an overlong line: out with a full piece
        s.partial.append(at, room);
        emit(s, s.partial, kBroken);
        s.partial.clear();
        at += room;
        continue;
      }
      s.partial.append(at, static_cast<size_t>(end - at));
      if (end == stop) break;
      emit(s, s.partial, *end);
      s.partial.clear();
      at = end + 1;
    }
  }
}

bool OutputRelay::pump(int timeout_ms, int wake_fd) {
  std::vector<pollfd> fds;
  std::vector<Stream*> owners;
  for (auto& s : streams_) {
    if (s.fd < 0) continue;
    fds.push_back({s.fd, POLLIN, 0});
    owners.push_back(&s);
  }
  if (wake_fd >= 0) fds.push_back({wake_fd, POLLIN, 0});
  if (fds.empty()) return false;
  int ready = ::poll(fds.data(), fds.size(), timeout_ms);
  if (ready <= 0) return false;
  for (size_t i = 0; i < owners.size(); ++i) {
    if (fds[i].revents != 0) read_from(*owners[i]);
  }
  return wake_fd >= 0 && (fds.back().revents & POLLIN) != 0;
}

void OutputRelay::drain(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto open_streams = [&] {
    for (auto& s : streams_)
      if (s.fd >= 0) return true;
    return false;
  };
  while (open_streams() && std::chrono::steady_clock::now() < deadline) pump(20);
  for (auto& s : streams_) {
    if (s.fd < 0) continue;
    read_from(s);
    finish(s);
    if (s.fd >= 0) ::close(s.fd);
    s.fd = -1;
  }
}

std::string OutputRelay::stderr_tail(int rank) const {
  for (const auto& [r, lines] : tails_) {
    if (r != rank) continue;
    std::string out;
    for (const auto& line : lines) out += line + "\n";
    return out;
  }
  return "";
}

void OutputRelay::reset(int attempt) {
  drain(0);
  streams_.clear();
  tails_.clear();
  for (auto& entry : log_files_) std::fclose(entry.second);
  log_files_.clear();
  attempt_ = attempt;
}

}  // namespace accelerant::detail
