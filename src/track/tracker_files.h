// An append-only file that a tracker writes whole records to (private to src/track).
#pragma once

#include <chrono>
#include <string>

namespace accelerant::detail {

/// Appends are buffered in memory and written with write(2) and fsync at flush(), so what a crash
/// leaves is whole records up to the last flush, and at most a cut-off prefix of the records of a
/// flush it interrupted: write(2) to a file can stop part way when the process is killed, and a
/// power loss keeps whatever part of an unfinished flush had reached the disk. Nothing logged
/// after the last flush began is in the file. flush_if_due() flushes when `interval` has passed
/// since the last flush.
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

/// Cuts a file of lines back to just after its last newline (to empty when it has none); does
/// nothing when it is missing or ends with a newline. A crash in the middle of a flush can leave
/// part of a line at the end (AppendFile); a run resumed in the same folder would otherwise glue
/// its first line onto that fragment. Throws Error naming the path when it cannot cut.
void drop_torn_last_line(const std::string& path);

/// A double as the shortest text that reads back as the same double ("0.1", "3", "nan", "inf").
std::string format_scalar(double value);

}  // namespace accelerant::detail
