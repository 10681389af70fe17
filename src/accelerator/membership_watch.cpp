#include "accelerator/membership_watch.h"

#include <chrono>
#include <string>
#include <thread>

#include "accelerant/accelerator.h"
#include "accelerant/process_state.h"
#include "base/text.h"
#include "comm/communicator_impl.h"

namespace accelerant::detail {

void MembershipWatch::at_batch() {
  if (accelerator_ == nullptr) return;
  Accelerator& acc = *accelerator_;
  TrainingState& state = *acc.state();
  if (!state.sync_gradients) return;  // between two micro-steps of one optimizer step
  Communicator& comm = ProcessState::get().communicator();
  if (!stop_after_) {
    if (!CommunicatorAccess::has_key(comm, "membership_change")) return;
    const std::string agreed = CommunicatorAccess::compare_set(
        comm, "stop_after_step", "", std::to_string(state.optimizer_steps + 1));
    stop_after_ = std::stoll(agreed);
  }
  // At the first boundary at or past the agreed step: the same boundary on every process, as each
  // sees the same step counts (two optimizers step the count by 2 per iteration).
  if (state.optimizer_steps < *stop_after_) return;
  const std::string checkpoint = acc.save_state();
  const int rank = acc.rank();
  acc.print("A machine arrived (elastic membership): every process stopped after step ",
            state.optimizer_steps, " with the checkpoint ", checkpoint,
            "; the launcher restarts the group with the new machine from there.");
  // The trackers written out and the group left together, then the launcher told: it stops every
  // process once all have said so (NodeGroup::take_arrivals). The store outlives the group.
  auto store = CommunicatorAccess::store(comm);
  acc.end_training();
  if (store) store->set(str("parked/", rank), CommunicatorAccess::bytes_of(checkpoint));
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace accelerant::detail
