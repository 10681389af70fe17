#include "accelerator/membership_watch.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "accelerant/accelerator.h"
#include "accelerant/error.h"
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
  if (state.optimizer_steps < *stop_after_) return;
  if (state.optimizer_steps > *stop_after_) {
    throw Error(str(ProcessState::get().rank_prefix(),
                    "elastic membership: the processes agreed to stop after step ", *stop_after_,
                    " for a machine that arrived, but this one is at step ", state.optimizer_steps,
                    " already. Likely cause: a process steps its optimizer without the others "
                    "(no all-reduce keeps it in step). Fix: step every process alike."));
  }
  const std::string checkpoint = acc.save_state();
  CommunicatorAccess::publish(comm, str("parked/", acc.rank()), checkpoint);
  if (acc.is_main_process()) {
    std::printf(
        "A machine arrived (elastic membership): every process stopped after step %lld "
        "with the checkpoint %s; the launcher restarts the group with the new machine "
        "from there.\n",
        static_cast<long long>(state.optimizer_steps), checkpoint.c_str());
    std::fflush(stdout);
  }
  acc.end_training();  // the trackers written out, the group left together
  // The launcher stops every process once all have parked (NodeGroup::take_arrivals).
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace accelerant::detail
