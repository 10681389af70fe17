// The state the Accelerator shares with the objects it prepared: whether this micro-step
// synchronises gradients, where the active data loader is, the fp16 loss scaler. The wrappers
// read it instead of holding a pointer to the Accelerator, so each can also be built alone.
#pragma once
#include <cstdint>
#include <memory>

#include "accelerant/grad_scaler.h"

namespace accelerant {

/// The state shared by an Accelerator and the objects it prepared (see the file comment): the
/// Accelerator's state(), or a std::make_shared<TrainingState>() for wrappers built alone. Plain
/// data, read and written on this process only.
struct TrainingState {
  /// False on the micro-steps of gradient accumulation that only accumulate: the optimizer and
  /// scheduler wrappers then do nothing, and the gradient reducer does not communicate.
  bool sync_gradients = true;
  /// Micro-steps counted by Accelerator::accumulate (how many make an optimizer step is
  /// Accelerator::gradient_accumulation_steps(), read from its settings).
  int64_t micro_steps = 0;
  /// The batch a prepared loader handed out last is the last of its epoch.
  bool end_of_dataloader = false;
  /// Padding samples (even_batches repeats) in the global step of that last batch, which
  /// gather_for_metrics drops. 0 before the last batch.
  int64_t padding_in_last_step = 0;
  /// The fp16 loss scaler; null unless mixed_precision is fp16.
  std::shared_ptr<GradScaler> scaler;
  /// Optimizer steps taken (skipped fp16 steps not counted).
  int64_t optimizer_steps = 0;
  /// The last optimizer step was skipped because fp16 gradients overflowed, or because it was
  /// abandoned.
  bool last_step_skipped = false;
  /// The step in progress was abandoned: a process died during its backward and the group
  /// recovered in place (Recovery::kReplaceFailedWorker). Until the loader hands out the next
  /// batch (the same one again, so that the step is done again in full), backward does nothing
  /// and every optimizer's step() skips.
  bool step_abandoned = false;
};

}  // namespace accelerant
