// Elastic membership's growth, on the workers' side (docs/launching.md "Elastic membership").
// While the group runs on fewer machines than it may (LaunchContract::machines_may_join), the
// launcher of machine 0 takes in a machine that arrives and writes `membership_change` into the
// group's store. Every process looks for it as its loader hands out a batch at an optimizer-step
// boundary; the first to see it proposes to stop after the next step, and compare-and-set makes
// that the agreed step for all (a process is never more than one step ahead of another, as each
// step's all-reduce waits for all). At that step every process saves a checkpoint (one collective
// save), ends training and waits; the launcher then restarts the group with the new machine, and
// auto_resume takes it from that checkpoint: no step is done again.
#pragma once

#include <cstdint>
#include <optional>

namespace accelerant {
class Accelerator;
}

namespace accelerant::detail {

class MembershipWatch {
 public:
  explicit MembershipWatch(Accelerator& accelerator) : accelerator_(&accelerator) {}
  /// The Accelerator is being destroyed: from now on nothing is done (loaders may outlive it).
  void detach() { accelerator_ = nullptr; }
  /// Called as a prepared loader hands out a batch. At the agreed step it saves, ends training
  /// and does not return (the launcher stops this process).
  void at_batch();

 private:
  Accelerator* accelerator_;
  std::optional<int64_t> stop_after_;  // the agreed step, once a machine arrived
};

}  // namespace accelerant::detail
