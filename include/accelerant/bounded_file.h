// Reading a file that may be hostile (a damaged disk, a file from the internet, a run folder
// shared by someone else): within a size cap, a regular file only (a FIFO, device or socket is
// refused at once, never waited on), and a symbolic link refused where a link could smuggle in
// another file (e.g. `accelerant report` copying a rank's stderr into a page people share).
#pragma once
#include <cstdint>
#include <string>

namespace accelerant {

/// Whether a symbolic link is read through or refused.
enum class Symlinks { kFollow, kRefuse };

/// A file read within a size cap: its bytes, or why there are none.
struct BoundedRead {
  /// The bytes read; empty when `problem` says why there are none.
  std::string bytes;
  /// "" on success; else the reason, starting with "it": "it does not exist", "it is a
  /// directory", "it cannot be read (Permission denied)", "it has 52428800 bytes, more than the
  /// limit of 1048576", "it is a symbolic link", "it is not a regular file (a device, pipe or
  /// socket)".
  std::string problem;
  /// The errno behind `problem`, 0 when there is none (a size or type problem).
  int error = 0;
};

/// Reads `path`, a regular file of at most `max_bytes` bytes. The size is checked with fstat
/// before anything is allocated, and again while reading (the file may grow). A FIFO is refused
/// without waiting for a writer.
BoundedRead read_bounded_file(const std::string& path, uint64_t max_bytes,
                              Symlinks symlinks = Symlinks::kFollow);

/// The last `max_bytes` bytes of `path` (all of it when shorter), with the same checks of type
/// and links as read_bounded_file: for logs, which may be long.
BoundedRead read_file_tail(const std::string& path, uint64_t max_bytes,
                           Symlinks symlinks = Symlinks::kFollow);

/// A problem above said of `subject`: ("manifest.json", "it is a directory") -> "manifest.json is
/// a directory".
std::string said_of(const std::string& subject, const std::string& problem);

}  // namespace accelerant
