// A POSIX shared-memory segment (/dev/shm) mapped into this process: what the ranks of one
// machine reduce through. Created by one rank, opened by the others, and unlinked as soon as all
// have mapped it, so that nothing is left in /dev/shm however the processes end afterwards
// (the memory is freed with the last mapping). A segment whose creator died before unlinking is
// removed by the next create() on the machine (remove_stale_segments).
#pragma once
#include <cstddef>
#include <string>

namespace accelerant::detail {

class SharedMemorySegment {
 public:
  SharedMemorySegment() = default;
  ~SharedMemorySegment();
  SharedMemorySegment(SharedMemorySegment&&) noexcept;
  SharedMemorySegment& operator=(SharedMemorySegment&&) noexcept;
  SharedMemorySegment(const SharedMemorySegment&) = delete;
  SharedMemorySegment& operator=(const SharedMemorySegment&) = delete;

  /// Creates a new segment of `bytes` (reserved with posix_fallocate, so that a full /dev/shm is
  /// an error here and not a SIGBUS later), zero-filled, named kNamePrefix<pid>-<nonce>.
  /// Throws std::runtime_error with the reason and the fix.
  static SharedMemorySegment create(size_t bytes);
  /// Maps the segment another process created. Throws std::runtime_error.
  static SharedMemorySegment open(const std::string& name, size_t bytes);

  /// Removes the name from /dev/shm; mappings stay valid. Idempotent.
  void unlink();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

  /// The prefix of every segment's name (in /dev/shm without the leading slash).
  static constexpr const char* kNamePrefix = "/accelerant-shm-";

 private:
  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool linked_ = false;
};

/// Unlinks /dev/shm/accelerant-shm-<pid>-* segments whose creator process no longer exists.
/// Returns how many were removed.
int remove_stale_segments();

}  // namespace accelerant::detail
