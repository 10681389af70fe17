#include "launch/output_relay.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "accelerant/error.h"

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

void OutputRelay::log(const Stream& s, const std::string& line) {
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
    if (file == nullptr) return;  // the console and the failure tail still have it
    log_files_.push_back({{s.rank, s.is_stderr}, file});
  }
  std::fputs(line.c_str(), file);
  std::fputc('\n', file);
  std::fflush(file);  // a crash of the launcher must not lose a worker's last lines
}

void OutputRelay::add(int fd, int rank, bool is_stderr) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  streams_.push_back({fd, rank, is_stderr, {}});
}

void OutputRelay::emit(const Stream& s, const std::string& line) {
  if (!log_dir_.empty()) log(s, line);
  if (log_dir_.empty() || tee_) write_to_console(s, line);
  remember_tail(s, line);
}

void OutputRelay::write_to_console(const Stream& s, const std::string& line) {
  std::string out = prefix_ ? rank_prefix(s.rank, world_size_) + line : line;
  out += '\n';
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

void OutputRelay::read_from(Stream& s) {
  char buffer[8192];
  while (true) {
    ssize_t n = ::read(s.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: nothing more for now
    if (n == 0) {       // EOF: the worker (and anything that inherited its pipe) is gone
      if (!s.partial.empty()) emit(s, s.partial);
      s.partial.clear();
      ::close(s.fd);
      s.fd = -1;
      return;
    }
    s.partial.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      emit(s, s.partial.substr(start, nl - start));
    }
    s.partial.erase(0, start);
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
    if (!s.partial.empty()) emit(s, s.partial);
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
