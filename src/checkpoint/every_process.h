// The agreement step of the checkpoint protocol: a step runs on every process, and every process
// learns how it went everywhere, so that a failure on one fails the call on all of them instead
// of leaving the others waiting in the next collective.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "accelerant/communicator.h"

namespace accelerant::detail {

/// The processes a checkpoint is saved or loaded by, as this process sees them.
struct CheckpointRanks {
  Communicator* communicator = nullptr;
  int rank = 0;
  int world_size = 1;
  /// "[rank r/N] " (or ""), the prefix of this process's errors.
  std::string rank_prefix;
  bool is_main() const { return rank == 0; }
};

/// What `step` returned on each process, by rank (empty where it threw), and the errors it
/// threw anywhere as "[rank r] what": the same on every process.
struct ProcessOutcomes {
  std::vector<std::string> results;
  std::vector<std::string> failures;
};

/// Runs `step` here and exchanges the outcomes (a collective: call on every process).
ProcessOutcomes outcomes_everywhere(const CheckpointRanks& ranks,
                                    const std::function<std::string()>& step);

/// Runs `step` on every process and throws CheckpointError on all of them if it threw on any,
/// naming `what` and each failure.
void on_every_process(const CheckpointRanks& ranks, const std::string& what,
                      const std::function<void()>& step);

}  // namespace accelerant::detail
