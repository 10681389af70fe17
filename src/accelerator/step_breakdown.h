// The cross-rank half of the step-time breakdown (base/step_timing.h measures each rank's
// steps): every `every` steps the ranks exchange their medians over the window, the main
// process logs them to the trackers, and a rank whose busy time is well above the others' is
// named once, with the phase it loses its time in.
//
// Why busy time rather than step time: the ranks meet at every all-reduce, so a slow rank makes
// every other rank's step as long as its own; they spend the difference waiting in the
// all-reduce. Step time minus that wait is what tells the straggler apart.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "accelerant/metrics.h"
#include "accelerant/tracker.h"
#include "base/step_timing.h"

namespace accelerant {
class Communicator;
}

namespace accelerant::detail {

// The rule itself, kStragglerThreshold and kStragglerMinExcess, is public (accelerant/metrics.h):
// `accelerant report` applies it too.
/// The warning names a rank once it is the straggler at this many exchanges in a row: one window
/// of a noisy machine is not a pattern (the scalars and metrics() still show every exchange's).
constexpr int kStragglerExchangesToWarn = 2;

/// The rank slowest by busy time if it is kStragglerThreshold and kStragglerMinExcess or more
/// above the median of the other ranks' busy time, else -1. Needs 2 or more ranks.
int find_straggler(const std::vector<StepTime>& ranks);

/// When to warn of a straggler: the same rank found at kStragglerExchangesToWarn exchanges in a
/// row, each rank once per run.
class StragglerWarnings {
 public:
  /// `found`: this exchange's find_straggler result. Returns the rank to name now, or -1.
  int observe(int found);

 private:
  int candidate_ = -1;
  int in_a_row_ = 0;
  std::set<int> named_;
};

/// What the straggler loses its time in, against the median of the other ranks: "data loading",
/// "compute (forward and backward)", "the optimizer" or "its own code between steps", with the
/// numbers, for the warning.
std::string describe_straggler(const std::vector<StepTime>& ranks, int straggler);

/// The tracker scalars of one exchange: `step_time/rank_<r>/<phase>_ms`, `.../step_ms`, and
/// `step_time/straggler`, the straggler's rank or -1.
TrackerScalars step_time_scalars(const std::vector<StepTime>& ranks, int straggler);

class StepBreakdown {
 public:
  struct Hooks {
    /// The ranks' communicator (looked up at each exchange: it may be gone after end_training).
    std::function<Communicator&()> communicator;
    /// Logs scalars at a step to the trackers, when they are started (main process only).
    std::function<void(const TrackerScalars&, int64_t)> log;
    /// The optimizer step count, the step the scalars are logged at.
    std::function<int64_t()> optimizer_step;
    /// After a failed exchange: whether in-place recovery takes care of it (a process died and
    /// the launcher replaces it), so that the exchange is skipped instead of thrown. Null: never.
    std::function<bool()> recovers_in_place;
    int rank = 0;
    int world = 1;
    std::string rank_prefix;
  };
  /// Listens to every timed step of this process from now on, until destroyed.
  StepBreakdown(int64_t every, Hooks hooks);
  ~StepBreakdown();
  StepBreakdown(const StepBreakdown&) = delete;
  StepBreakdown& operator=(const StepBreakdown&) = delete;

 private:
  void on_step(const StepTime& step);
  void exchange();

  int64_t every_;
  Hooks hooks_;
  std::vector<StepTime> window_;
  int64_t last_exchange_at_ = -1;  // the optimizer step of the last exchange
  StragglerWarnings warnings_;
};

}  // namespace accelerant::detail
