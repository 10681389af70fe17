// Exceptions thrown by Accelerant. Every message says what happened, with which values, the likely
// cause and the fix; where a rank is known it starts with "[rank r/N]".
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace accelerant {

/// "[rank r/N] ": the one prefix of every message, error and output line about rank r of N.
std::string rank_prefix(int rank, int world_size);

/// Root of every exception Accelerant throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The distributed environment (RANK, WORLD_SIZE, SLURM_*, OMPI_COMM_WORLD_*, ...) is invalid.
class EnvironmentError : public Error {
 public:
  /// `variable` is at fault with `value` ("" when it is missing); `message` is the whole text.
  EnvironmentError(std::string variable, std::string value, const std::string& message)
      : Error(message), variable_(std::move(variable)), value_(std::move(value)) {}
  /// The offending variable, e.g. "RANK".
  const std::string& variable() const noexcept { return variable_; }
  /// Its value as read, or "" when it was missing.
  const std::string& value() const noexcept { return value_; }

 private:
  std::string variable_;
  std::string value_;
};

/// A collective failed: a peer did not arrive within the timeout, a connection broke, or the
/// ranks disagreed about what they were doing. The communicator cannot be used afterwards.
class CollectiveError : public Error {
 public:
  /// `message` is the whole text; `missing_ranks` as missing_ranks() returns them.
  CollectiveError(const std::string& message, std::vector<int> missing_ranks)
      : Error(message), missing_ranks_(std::move(missing_ranks)) {}
  /// Ranks that never reported reaching the failed collective (empty when all did).
  const std::vector<int>& missing_ranks() const noexcept { return missing_ranks_; }

 private:
  std::vector<int> missing_ranks_;
};

/// The ranks disagree about a collective: debug mode or a gather found different shapes, dtypes
/// or ops, or, after a timeout, the ranks' flight records show that they issued different
/// collectives (the message names each one and the public call that issued it).
class CollectiveMismatchError : public CollectiveError {
 public:
  /// `message` is the whole text, naming both ranks' collectives.
  explicit CollectiveMismatchError(const std::string& message) : CollectiveError(message, {}) {}
};

/// How one worker process ended.
struct WorkerExit {
  int rank = -1;            ///< global rank
  int local_rank = -1;      ///< index on its node
  int pid = -1;             ///< its process id (on its own machine)
  int exit_code = -1;       ///< valid when signal == 0
  int signal = 0;           ///< the signal that killed it, 0 when it exited
  std::string error_text;   ///< the uncaught exception's text, when the worker recorded one
  std::string stderr_tail;  ///< the last lines it wrote to stderr
};

/// accelerant::launch gave up: a worker failed after all restarts were used, or setup failed.
class LaunchError : public Error {
 public:
  /// `message` is the whole text; the rest as the getters below return it.
  LaunchError(const std::string& message, WorkerExit first_failure = {}, int restarts_used = 0)
      : Error(message), first_failure_(std::move(first_failure)), restarts_used_(restarts_used) {}
  /// The first worker that failed in the last attempt (rank -1 when no worker had failed).
  const WorkerExit& first_failure() const noexcept { return first_failure_; }
  /// How many times the workers were restarted before giving up (at most
  /// LaunchOptions::max_restarts).
  int restarts_used() const noexcept { return restarts_used_; }

 private:
  WorkerExit first_failure_;
  int restarts_used_;
};

/// A checkpoint could not be written, or one that was asked for is missing, damaged, from an
/// unknown format version or does not fit the objects it should be loaded into. Nothing was
/// changed: a failed save keeps the previous checkpoint, a failed load leaves every object as it
/// was.
class CheckpointError : public Error {
 public:
  /// `message` is the whole text; `path` as path() returns it ("" when no one file is at fault).
  CheckpointError(const std::string& message, std::string path = {})
      : Error(message), path_(std::move(path)) {}
  /// The file or directory at fault, when one is.
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

}  // namespace accelerant
