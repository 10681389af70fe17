// An append-only file that a tracker writes whole records to (private to src/track).
#pragma once

#include <chrono>
#include <string>

namespace accelerant::detail {

/// Appends are buffered in memory and written with write(2) and fsync at flush(), so the file
/// only ever grows by whole records: a crash leaves a readable file up to the last flush.
/// flush_if_due() flushes when `interval` has passed since the last flush.
class AppendFile {
 public:
  AppendFile() = default;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();
  /// Opens `path` for appending, creating it; `keep` false empties it first. Returns the bytes it
  /// already held (0 when new or emptied). Throws Error naming the path and errno on failure.
  long long open(const std::string& path, bool keep = false);
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  void append(const std::string& bytes) { pending_ += bytes; }
  void flush();
  void flush_if_due(std::chrono::steady_clock::duration interval);
  void close();

 private:
  int fd_ = -1;
  std::string path_;
  std::string pending_;
  std::chrono::steady_clock::time_point last_flush_ = std::chrono::steady_clock::now();
};

/// A double as the shortest text that reads back as the same double ("0.1", "3", "nan", "inf").
std::string format_scalar(double value);

}  // namespace accelerant::detail
