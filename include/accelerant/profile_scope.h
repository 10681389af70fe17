// What Accelerator::profile returns: the handle of one recording of a profiler trace
// (docs/observability.md "Profiler traces").
#pragma once
#include <memory>
#include <string>

namespace accelerant {

class Accelerator;

/// While it records, LibTorch's operators on the calling thread and Accelerant's spans (gradient
/// all-reduce buckets, checkpoints, data waits, optimizer steps) are recorded; stop() or the
/// destructor ends the recording and writes the files. Stopping is a collective: every process
/// stops together. Movable, not copyable.
class ProfileScope {
 public:
  /// A scope that records nothing.
  ProfileScope() = default;
  /// Stops (as stop()) if still recording. While an exception unwinds, it writes this process's
  /// file only, without waiting for the others, and reports no error.
  ~ProfileScope();
  /// Takes over `other`'s recording; `other` then records nothing.
  ProfileScope(ProfileScope&& other) noexcept = default;
  /// Stops this scope's recording first (a collective), then takes over `other`'s.
  ProfileScope& operator=(ProfileScope&& other);
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

  /// Ends the recording: writes `trace_rank<r>.json`, waits for every process, and on the main
  /// process merges every rank's file into `trace.json`. Call it on every process. A step range
  /// not reached yet is dropped. Later calls do nothing.
  void stop();
  /// Whether a trace is being recorded now (false before a step range starts and after stop).
  bool recording() const;
  /// The folder the trace files go to.
  std::string dir() const;

 private:
  friend class Accelerator;  // Accelerator::profile makes the scopes that record
  struct Session;            // src/accelerator/profile_scope.cpp
  explicit ProfileScope(std::shared_ptr<Session> session) : session_(std::move(session)) {}
  std::shared_ptr<Session> session_;
};

}  // namespace accelerant
