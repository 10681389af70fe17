// File-system steps of a crash-safe checkpoint: files and directories written, fsynced and
// renamed so that a crash at any moment leaves either the old or the new state, never a mix.
// Every failure throws CheckpointError with the path, the system's reason and a fix.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace accelerant::detail {

/// Writes `bytes` to `path` (created or truncated) and fsyncs it; returns their CRC-32, counted as
/// they were written. A full disk, a read-only directory or a missing directory throws
/// CheckpointError naming `path` and `what`.
uint32_t write_file_durably(const std::string& path, const std::string& bytes,
                            const std::string& what);

/// write_file_durably into a hidden temporary file beside `path`, renamed over `path` and the
/// directory fsynced: readers see the old file or the new one, never a part.
void replace_file_durably(const std::string& path, const std::string& bytes,
                          const std::string& what);

/// A file written piece by piece, durably: write_file_durably's file (`replace` false), or
/// replace_file_durably's (a hidden temporary file beside `path`, renamed over it by commit()).
/// Destroyed before commit(), a replacement's temporary file is removed. Every failure throws
/// CheckpointError naming the path, `what` and the fix.
class DurableFileWriter {
 public:
  DurableFileWriter(std::string path, std::string what, bool replace);
  ~DurableFileWriter();
  DurableFileWriter(const DurableFileWriter&) = delete;
  DurableFileWriter& operator=(const DurableFileWriter&) = delete;
  /// Writes the next `bytes` bytes.
  void append(const void* data, size_t bytes);
  /// fsyncs and closes the file; a replacement is then renamed over `path`, the directory
  /// fsynced.
  void commit();
  /// The bytes written so far, and their CRC-32 (a checkpoint's manifest lists both).
  uint64_t size() const { return written_; }
  uint32_t crc32() const { return crc32_; }

 private:
  std::string path_;    // what is written
  std::string target_;  // where it ends
  std::string what_;
  int fd_ = -1;
  uint64_t written_ = 0;
  uint32_t crc32_ = 0;
  bool committed_ = false;
};

/// fsyncs a directory, making the names created or renamed in it durable.
void sync_directory(const std::string& dir);

/// mkdir -p.
void make_directories(const std::string& dir);

/// rm -rf; no error when `path` does not exist.
void remove_tree_quietly(const std::string& path);

/// Moves the directory `from` to `to` atomically. If `to` exists it is swapped out
/// (renameat2 RENAME_EXCHANGE) and then removed, so that at every moment `to` names a complete
/// directory: the old one or the new one. Both parents are fsynced.
void publish_directory(const std::string& from, const std::string& to);

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
/// Names of the entries of `dir` (not . and ..); empty when it cannot be read.
std::vector<std::string> list_directory(const std::string& dir);
/// The parent directory of `path` ("." when it has none).
std::string parent_of(const std::string& path);
/// The last component of `path`.
std::string base_name(const std::string& path);

/// zlib's CRC-32 of `bytes`.
uint32_t crc32_of(const std::string& bytes);
/// The CRC-32 `crc` of some bytes, extended by the next `bytes` bytes at `data`.
uint32_t crc32_extend(uint32_t crc, const void* data, size_t bytes);
/// The CRC-32 of the file at `path`, read a few MiB at a time (a model's weights are never
/// whole in memory for it); false when it cannot be opened or read.
bool crc32_of_file(const std::string& path, uint32_t* crc);

}  // namespace accelerant::detail
